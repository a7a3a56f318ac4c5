/*
 * The embedded benchmark's shape on LMDB, for scripts/bench-embedded.sh:
 * 8-byte big-endian integer keys, 32-byte values (eight random floats from
 * the same xorshift64* as engine/benches/embedded), one thread, one call
 * per item: N puts in key order, then N gets of keys drawn uniformly from
 * 0..N (the same draws as ringkv's run with the same seed).
 *
 *   lmdb_sweep DIR N MODE [BATCH]
 *
 * MODE "nosync": every put in one write transaction, the environment
 * opened with MDB_NOSYNC (nothing forced to the device; the document's
 * no-durability case). MODE "sync": one durable commit per BATCH puts
 * (default 1: a commit per item). Reads run in one read transaction.
 * Prints one JSON line.
 */
#include <lmdb.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

static uint64_t rng_state;

static uint64_t rng_next(void) {
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return rng_state * 0x2545f4914f6cdd1dULL;
}

static void value(unsigned char out[32]) {
    for (int i = 0; i < 8; i++) {
        float f = (float)(rng_next() >> 40) / (float)(1ULL << 24);
        memcpy(out + 4 * i, &f, 4);
    }
}

static void key(uint64_t i, unsigned char out[8]) {
    for (int b = 0; b < 8; b++) out[b] = (unsigned char)(i >> (56 - 8 * b));
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static double cpu_s(void) {
    struct rusage u;
    getrusage(RUSAGE_SELF, &u);
    return u.ru_utime.tv_sec + u.ru_utime.tv_usec / 1e6 + u.ru_stime.tv_sec + u.ru_stime.tv_usec / 1e6;
}

#define CHECK(call)                                                        \
    do {                                                                   \
        int rc_ = (call);                                                  \
        if (rc_ != 0) {                                                    \
            fprintf(stderr, "%s: %s\n", #call, mdb_strerror(rc_));         \
            exit(1);                                                       \
        }                                                                  \
    } while (0)

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: %s DIR N nosync|sync [BATCH]\n", argv[0]);
        return 2;
    }
    const char *dir = argv[1];
    uint64_t n = strtoull(argv[2], NULL, 10);
    int sync = strcmp(argv[3], "sync") == 0;
    uint64_t batch = argc > 4 ? strtoull(argv[4], NULL, 10) : 1;
    if (batch == 0) batch = 1;
    rng_state = 1;

    MDB_env *env;
    MDB_dbi dbi;
    MDB_txn *txn;
    CHECK(mdb_env_create(&env));
    /* Room for the data and its B-tree with slack. */
    CHECK(mdb_env_set_mapsize(env, (size_t)(n * 200 + (64u << 20))));
    CHECK(mdb_env_open(env, dir, sync ? 0 : MDB_NOSYNC, 0644));

    unsigned char k[8], v[32];
    MDB_val mk = {8, k}, mv = {32, v};
    double c0 = cpu_s(), t0 = now_s();
    if (!sync) {
        CHECK(mdb_txn_begin(env, NULL, 0, &txn));
        CHECK(mdb_dbi_open(txn, NULL, 0, &dbi));
        for (uint64_t i = 0; i < n; i++) {
            key(i, k);
            value(v);
            mk.mv_size = 8; mk.mv_data = k; mv.mv_size = 32; mv.mv_data = v;
            CHECK(mdb_put(txn, dbi, &mk, &mv, 0));
        }
        CHECK(mdb_txn_commit(txn));
    } else {
        CHECK(mdb_txn_begin(env, NULL, 0, &txn));
        CHECK(mdb_dbi_open(txn, NULL, 0, &dbi));
        CHECK(mdb_txn_commit(txn));
        for (uint64_t i = 0; i < n;) {
            CHECK(mdb_txn_begin(env, NULL, 0, &txn));
            for (uint64_t j = 0; j < batch && i < n; j++, i++) {
                key(i, k);
                value(v);
                mk.mv_size = 8; mk.mv_data = k; mv.mv_size = 32; mv.mv_data = v;
                CHECK(mdb_put(txn, dbi, &mk, &mv, 0));
            }
            CHECK(mdb_txn_commit(txn));
        }
    }
    double t1 = now_s(), c1 = cpu_s();

    uint64_t found = 0;
    CHECK(mdb_txn_begin(env, NULL, MDB_RDONLY, &txn));
    for (uint64_t i = 0; i < n; i++) {
        uint64_t r = rng_next() % (n ? n : 1);
        key(r, k);
        mk.mv_size = 8; mk.mv_data = k;
        if (mdb_get(txn, dbi, &mk, &mv) == 0 && mv.mv_size == 32) found++;
    }
    mdb_txn_abort(txn);
    double t2 = now_s(), c2 = cpu_s();
    if (found != n) {
        fprintf(stderr, "read %llu of %llu keys\n", (unsigned long long)found, (unsigned long long)n);
        return 1;
    }
    mdb_env_close(env);
    printf("{\"store\":\"lmdb\",\"items\":%llu,\"mode\":\"%s\",\"batch\":%llu,\"write_s\":%.4f,\"read_s\":%.4f,"
           "\"write_ns\":%.1f,\"read_ns\":%.1f,\"write_cpu_s\":%.4f,\"read_cpu_s\":%.4f}\n",
           (unsigned long long)n, sync ? "sync" : "nosync", (unsigned long long)batch, t1 - t0, t2 - t1,
           (t1 - t0) * 1e9 / (n ? n : 1), (t2 - t1) * 1e9 / (n ? n : 1), c1 - c0, c2 - c1);
    return 0;
}
