//! Test certificates: a CA of its own and certificates it signs.

use std::path::{Path, PathBuf};

use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair};

/// A CA and the PEM file of its certificate.
pub struct Ca {
    pub issuer: CertifiedIssuer<'static, KeyPair>,
    pub pem: PathBuf,
}

/// A new self-signed CA, its certificate written to `dir/NAME-ca.pem`.
pub fn new_ca(dir: &Path, name: &str) -> Ca {
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params
        .distinguished_name
        .push(DnType::CommonName, format!("ringkv test CA {name}"));
    let issuer = CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap();
    let pem = dir.join(format!("{name}-ca.pem"));
    std::fs::write(&pem, issuer.pem()).unwrap();
    Ca { issuer, pem }
}

/// Writes a certificate for `names` signed by `ca` and its key to
/// `cert`/`key` (replacing them atomically, as a certificate rotation does).
pub fn issue(ca: &Ca, names: &[&str], cert: &Path, key: &Path) {
    let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
    let mut params = CertificateParams::new(names).unwrap();
    params
        .distinguished_name
        .push(DnType::CommonName, "ringkv test");
    let key_pair = KeyPair::generate().unwrap();
    let signed = params.signed_by(&key_pair, &ca.issuer).unwrap();
    for (path, text) in [(cert, signed.pem()), (key, key_pair.serialize_pem())] {
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, text).unwrap();
        std::fs::rename(&tmp, path).unwrap();
    }
}
