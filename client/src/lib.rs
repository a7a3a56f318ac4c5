//! ringkv's wire protocol and async client.
