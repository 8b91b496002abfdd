/* The libcrypto wrappers against published test vectors: SHA-256 (FIPS
 * 180-4 examples), HMAC-SHA-256 (RFC 4231 cases 1, 2 and 6), HKDF (RFC 5869
 * case 1), scrypt (RFC 7914, the 1024/8/16 case), AES-256-GCM (the GCM
 * specification's test case 14: zero key, zero nonce = frame 0); frames
 * that were altered, replayed under another number or carry another
 * header are refused by both ciphers; X25519 agreement; and the
 * random-bytes helper. */
#include "config.h"
#include "comm/base/crypto.h"

#include <CUnit/Basic.h>
#include <stdio.h>
#include <string.h>

static void hex(const uint8_t *d, char *out)
{
    for (int i = 0; i < GEO_SHA256_BYTES; i++)
        sprintf(out + 2 * i, "%02x", d[i]);
}

static void hexn(const uint8_t *d, size_t n, char *out)
{
    for (size_t i = 0; i < n; i++)
        sprintf(out + 2 * i, "%02x", d[i]);
}

static void sha(const void *m, size_t n, char *out)
{
    uint8_t d[GEO_SHA256_BYTES];
    geoSha256(m, n, d);
    hex(d, out);
}

static void test_sha256_vectors(void)
{
    char h[65];
    sha("", 0, h);
    CU_ASSERT_STRING_EQUAL(h, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    sha("abc", 3, h);
    CU_ASSERT_STRING_EQUAL(h, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    const char *two = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
    sha(two, strlen(two), h);
    CU_ASSERT_STRING_EQUAL(h, "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
}

static void test_hkdf_rfc5869(void)
{
    uint8_t ikm[22], salt[13], info[10], okm[42];
    char h[85];
    memset(ikm, 0x0b, sizeof(ikm));
    for (int i = 0; i < 13; i++)
        salt[i] = (uint8_t)i;
    for (int i = 0; i < 10; i++)
        info[i] = (uint8_t)(0xf0 + i);
    CU_ASSERT_EQUAL(geoHkdf(ikm, sizeof(ikm), salt, sizeof(salt), info, sizeof(info), okm,
                            sizeof(okm)), 0);
    hexn(okm, sizeof(okm), h);
    CU_ASSERT_STRING_EQUAL(h, "3cb25f25faacd57a90434f64d0362f2a2d2d0a90cf1a5a4c5db02d56ecc4c5bf"
                              "34007208d5b887185865");
}

static void test_scrypt_rfc7914(void)
{
    uint8_t out[64];
    char h[129];
    CU_ASSERT_EQUAL(geoScrypt("password", 8, "NaCl", 4, 1024, 8, 16, out, sizeof(out)), 0);
    hexn(out, sizeof(out), h);
    CU_ASSERT_STRING_EQUAL(h, "fdbabe1c9d3472007856e7190d01e9fe7c6ad7cbc8237830e77376634b373162"
                              "2eaf30d92e22a3886ff109279d9830dac727afb94a83ee6d8360cbdfa2cc0640");
    CU_ASSERT_EQUAL(geoScrypt("password", 8, "NaCl", 4, 1000, 8, 16, out, sizeof(out)), -1);
}

static void test_aes_gcm_vector(void)
{
    uint8_t key[32] = {0}, pt[16] = {0}, ct[16], tag[16];
    char h[33];
    geoAead a;
    CU_ASSERT_EQUAL_FATAL(geoAeadInit(&a, GEO_CIPHER_AES256GCM, key, 1), 0);
    CU_ASSERT_EQUAL(geoAeadSeal(&a, 0, NULL, 0, pt, ct, sizeof(pt), tag), 0);
    hexn(ct, 16, h);
    CU_ASSERT_STRING_EQUAL(h, "cea7403d4d606b6e074ec5d3baf39d18");
    hexn(tag, 16, h);
    CU_ASSERT_STRING_EQUAL(h, "d0d1c8a799996bf0265b98b5d48ab919");
    geoAeadFree(&a);
}

/* Seal a frame, then open it as sent (works) and altered in each way a
 * network attacker could (refused). */
static void check_cipher(int cipher)
{
    uint8_t key[32], hdr[40], pt[4099], ct[4099], back[4099], tag[16], bad[16];
    geoAead tx, rx;
    for (int i = 0; i < 32; i++)
        key[i] = (uint8_t)(i * 13 + cipher);
    for (size_t i = 0; i < sizeof(pt); i++)
        pt[i] = (uint8_t)(i * 7);
    memset(hdr, 0x33, sizeof(hdr));
    CU_ASSERT_EQUAL_FATAL(geoAeadInit(&tx, cipher, key, 1), 0);
    CU_ASSERT_EQUAL_FATAL(geoAeadInit(&rx, cipher, key, 0), 0);
    for (uint64_t k = 0; k < 3; k++) {
        CU_ASSERT_EQUAL(geoAeadSeal(&tx, k, hdr, sizeof(hdr), pt, ct, sizeof(pt), tag), 0);
        CU_ASSERT_NOT_EQUAL(memcmp(pt, ct, sizeof(pt)), 0);
        CU_ASSERT_EQUAL(geoAeadOpen(&rx, k, hdr, sizeof(hdr), ct, back, sizeof(pt), tag), 0);
        CU_ASSERT_EQUAL(memcmp(pt, back, sizeof(pt)), 0);
    }
    /* Replayed or reordered: frame 2 opened as frame 1. */
    CU_ASSERT_EQUAL(geoAeadOpen(&rx, 1, hdr, sizeof(hdr), ct, back, sizeof(pt), tag), -1);
    /* One bit of payload, header or tag changed. */
    ct[100] ^= 4;
    CU_ASSERT_EQUAL(geoAeadOpen(&rx, 2, hdr, sizeof(hdr), ct, back, sizeof(pt), tag), -1);
    ct[100] ^= 4;
    hdr[5] ^= 1;
    CU_ASSERT_EQUAL(geoAeadOpen(&rx, 2, hdr, sizeof(hdr), ct, back, sizeof(pt), tag), -1);
    hdr[5] ^= 1;
    memcpy(bad, tag, 16);
    bad[15] ^= 0x80;
    CU_ASSERT_EQUAL(geoAeadOpen(&rx, 2, hdr, sizeof(hdr), ct, back, sizeof(pt), bad), -1);
    /* Truncated. */
    CU_ASSERT_EQUAL(geoAeadOpen(&rx, 2, hdr, sizeof(hdr), ct, back, sizeof(pt) - 1, tag), -1);
    /* And still fine as sent, in place. */
    CU_ASSERT_EQUAL(geoAeadOpen(&rx, 2, hdr, sizeof(hdr), ct, ct, sizeof(pt), tag), 0);
    CU_ASSERT_EQUAL(memcmp(pt, ct, sizeof(pt)), 0);
    /* Another key refuses it. */
    geoAead other;
    key[0] ^= 1;
    CU_ASSERT_EQUAL_FATAL(geoAeadInit(&other, cipher, key, 0), 0);
    CU_ASSERT_EQUAL(geoAeadSeal(&tx, 3, hdr, sizeof(hdr), pt, ct, sizeof(pt), tag), 0);
    CU_ASSERT_EQUAL(geoAeadOpen(&other, 3, hdr, sizeof(hdr), ct, back, sizeof(pt), tag), -1);
    geoAeadFree(&other);
    geoAeadFree(&tx);
    geoAeadFree(&rx);
}

/* Two ephemeral key pairs agree on the shared secret, a third does not,
 * and the all-zero public key (a small-order point) is refused. */
static void test_x25519(void)
{
    void *a = NULL, *b = NULL, *c = NULL;
    uint8_t pa[32], pb[32], pc[32], s1[32], s2[32], s3[32], zero[32] = {0};
    CU_ASSERT_EQUAL_FATAL(geoX25519New(&a, pa), 0);
    CU_ASSERT_EQUAL_FATAL(geoX25519New(&b, pb), 0);
    CU_ASSERT_EQUAL_FATAL(geoX25519New(&c, pc), 0);
    CU_ASSERT_NOT_EQUAL(memcmp(pa, pb, 32), 0);
    CU_ASSERT_EQUAL(geoX25519Shared(a, pb, s1), 0);
    CU_ASSERT_EQUAL(geoX25519Shared(b, pa, s2), 0);
    CU_ASSERT_EQUAL(memcmp(s1, s2, 32), 0);
    CU_ASSERT_EQUAL(geoX25519Shared(c, pa, s3), 0);
    CU_ASSERT_NOT_EQUAL(memcmp(s1, s3, 32), 0);
    CU_ASSERT_EQUAL(geoX25519Shared(a, zero, s3), -1);
    geoX25519Free(a);
    geoX25519Free(b);
    geoX25519Free(c);
}

static void test_aead_refuses_changes(void)
{
    check_cipher(GEO_CIPHER_AES256GCM);
    check_cipher(GEO_CIPHER_CHACHA20POLY1305);
    CU_ASSERT_TRUE(geoCipherPreferred() == GEO_CIPHER_AES256GCM ||
                   geoCipherPreferred() == GEO_CIPHER_CHACHA20POLY1305);
}

static void test_hmac_rfc4231(void)
{
    uint8_t key1[20], d[GEO_SHA256_BYTES], key6[131];
    char h[65];
    memset(key1, 0x0b, sizeof(key1));
    geoHmacSha256(key1, sizeof(key1), "Hi There", 8, d);
    hex(d, h);
    CU_ASSERT_STRING_EQUAL(h, "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7");
    geoHmacSha256("Jefe", 4, "what do ya want for nothing?", 28, d);
    hex(d, h);
    CU_ASSERT_STRING_EQUAL(h, "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
    memset(key6, 0xaa, sizeof(key6));
    const char *m6 = "Test Using Larger Than Block-Size Key - Hash Key First";
    geoHmacSha256(key6, sizeof(key6), m6, strlen(m6), d);
    hex(d, h);
    CU_ASSERT_STRING_EQUAL(h, "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54");
}

static void test_digest_equal_and_random(void)
{
    uint8_t a[32] = {0}, b[32] = {0}, r1[32], r2[32];
    CU_ASSERT_TRUE(geoDigestEqual(a, b, 32));
    b[31] = 1;
    CU_ASSERT_FALSE(geoDigestEqual(a, b, 32));
    CU_ASSERT_EQUAL(geoRandomBytes(r1, sizeof(r1)), 0);
    CU_ASSERT_EQUAL(geoRandomBytes(r2, sizeof(r2)), 0);
    CU_ASSERT_FALSE(geoDigestEqual(r1, r2, 32));
}

int main(void)
{
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("crypto", NULL, NULL);
    CU_add_test(s, "sha256 vectors", test_sha256_vectors);
    CU_add_test(s, "hkdf rfc5869", test_hkdf_rfc5869);
    CU_add_test(s, "scrypt rfc7914", test_scrypt_rfc7914);
    CU_add_test(s, "aes-256-gcm vector", test_aes_gcm_vector);
    CU_add_test(s, "aead refuses changes", test_aead_refuses_changes);
    CU_add_test(s, "x25519 agreement", test_x25519);
    CU_add_test(s, "hmac rfc4231", test_hmac_rfc4231);
    CU_add_test(s, "digest compare and random", test_digest_equal_and_random);
    CU_basic_set_mode(CU_BRM_VERBOSE);
    CU_basic_run_tests();
    unsigned f = CU_get_number_of_failures();
    CU_cleanup_registry();
    return f ? 1 : 0;
}
