/* SHA-256 / HMAC-SHA-256 against published test vectors (FIPS 180-4
 * examples, RFC 4231 cases 1, 2 and 6), and the random-bytes helper. */
#include "config.h"
#include "comm/base/hmac.h"

#include <CUnit/Basic.h>
#include <stdio.h>
#include <string.h>

static void hex(const uint8_t *d, char *out)
{
    for (int i = 0; i < GEO_SHA256_BYTES; i++)
        sprintf(out + 2 * i, "%02x", d[i]);
}

static void sha(const void *m, size_t n, char *out)
{
    geoSha256 s;
    uint8_t d[GEO_SHA256_BYTES];
    geoSha256Init(&s);
    geoSha256Update(&s, m, n);
    geoSha256Final(&s, d);
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

static void test_sha256_incremental(void)
{
    /* Feeding in odd pieces gives the same digest as one call. */
    char buf[1000], a[65], b[65];
    uint8_t d[GEO_SHA256_BYTES];
    geoSha256 s;
    for (int i = 0; i < 1000; i++)
        buf[i] = (char)(i * 7);
    sha(buf, sizeof(buf), a);
    geoSha256Init(&s);
    for (size_t off = 0, step = 1; off < sizeof(buf); off += step, step = step * 3 % 97 + 1)
        geoSha256Update(&s, buf + off, off + step > sizeof(buf) ? sizeof(buf) - off : step);
    geoSha256Final(&s, d);
    hex(d, b);
    CU_ASSERT_STRING_EQUAL(a, b);
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
    CU_pSuite s = CU_add_suite("hmac", NULL, NULL);
    CU_add_test(s, "sha256 vectors", test_sha256_vectors);
    CU_add_test(s, "sha256 incremental", test_sha256_incremental);
    CU_add_test(s, "hmac rfc4231", test_hmac_rfc4231);
    CU_add_test(s, "digest compare and random", test_digest_equal_and_random);
    CU_basic_set_mode(CU_BRM_VERBOSE);
    CU_basic_run_tests();
    unsigned f = CU_get_number_of_failures();
    CU_cleanup_registry();
    return f ? 1 : 0;
}
