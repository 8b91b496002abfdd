/* Base64 and the few JSON scanners the etcd client needs (etcd.h).  The
 * gateway's answers come from the network: every scanner stops at the
 * text's NUL and returns NULL or -1 on anything malformed, and nesting is
 * bounded, so a hostile or broken answer costs an error, never a crash. */
#include "config.h"
#include "comm/elastic/etcd.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

static const char b64_alphabet[] =
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

void geoB64Encode(const void *in, size_t n, char *out)
{
    const uint8_t *s = in;
    size_t i, o = 0;
    for (i = 0; i + 2 < n; i += 3) {
        uint32_t v = (uint32_t)s[i] << 16 | (uint32_t)s[i + 1] << 8 | s[i + 2];
        out[o++] = b64_alphabet[v >> 18];
        out[o++] = b64_alphabet[(v >> 12) & 63];
        out[o++] = b64_alphabet[(v >> 6) & 63];
        out[o++] = b64_alphabet[v & 63];
    }
    if (i < n) {
        uint32_t v = (uint32_t)s[i] << 16 | (i + 1 < n ? (uint32_t)s[i + 1] << 8 : 0);
        out[o++] = b64_alphabet[v >> 18];
        out[o++] = b64_alphabet[(v >> 12) & 63];
        out[o++] = i + 1 < n ? b64_alphabet[(v >> 6) & 63] : '=';
        out[o++] = '=';
    }
    out[o] = '\0';
}

char *geoB64EncodeAlloc(const void *in, size_t n)
{
    char *s = malloc(4 * ((n + 2) / 3) + 1);
    if (s != NULL)
        geoB64Encode(in, n, s);
    return s;
}

static int b64_value(char c)
{
    if (c >= 'A' && c <= 'Z')
        return c - 'A';
    if (c >= 'a' && c <= 'z')
        return c - 'a' + 26;
    if (c >= '0' && c <= '9')
        return c - '0' + 52;
    if (c == '+' || c == '-')
        return 62;
    if (c == '/' || c == '_')
        return 63;
    return -1;
}

int geoB64Decode(const char *in, size_t len, uint8_t *out, size_t *n)
{
    while (len > 0 && in[len - 1] == '=')
        len--;
    if (len % 4 == 1)
        return -1;
    uint32_t acc = 0;
    int bits = 0;
    size_t o = 0;
    for (size_t i = 0; i < len; i++) {
        int v = b64_value(in[i]);
        if (v < 0)
            return -1;
        acc = (acc << 6) | (uint32_t)v;
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            out[o++] = (uint8_t)(acc >> bits);
        }
    }
    *n = o;
    return 0;
}

#define JSON_MAX_DEPTH 32

static const char *ws(const char *p)
{
    while (p && (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r'))
        p++;
    return p;
}

/* Past the string whose opening quote is at p. */
static const char *skip_string(const char *p)
{
    for (p++; *p; p++) {
        if (*p == '\\') {
            if (p[1] == '\0')
                return NULL;
            p++;
        } else if (*p == '"') {
            return p + 1;
        }
    }
    return NULL;
}

static const char *skip_value(const char *p, int depth)
{
    p = ws(p);
    if (p == NULL || depth > JSON_MAX_DEPTH)
        return NULL;
    if (*p == '"')
        return skip_string(p);
    if (*p == '{' || *p == '[') {
        char close = *p == '{' ? '}' : ']';
        p = ws(p + 1);
        if (*p == close)
            return p + 1;
        for (;;) {
            if (close == '}') {
                if (*p != '"' || (p = skip_string(p)) == NULL)
                    return NULL;
                p = ws(p);
                if (*p != ':')
                    return NULL;
                p++;
            }
            if ((p = skip_value(p, depth + 1)) == NULL)
                return NULL;
            p = ws(p);
            if (*p == ',') {
                p = ws(p + 1);
                continue;
            }
            return *p == close ? p + 1 : NULL;
        }
    }
    /* number, true, false, null */
    const char *s = p;
    while (*p && strchr("+-.0123456789eEtruefalsn", *p))
        p++;
    return p > s ? p : NULL;
}

const char *geoJsonSkip(const char *p) { return skip_value(p, 0); }

const char *geoJsonGet(const char *p, const char *key)
{
    size_t klen = strlen(key);
    p = ws(p);
    if (p == NULL || *p != '{')
        return NULL;
    p = ws(p + 1);
    while (*p == '"') {
        const char *k = p + 1, *end = skip_string(p);
        if (end == NULL)
            return NULL;
        int match = (size_t)(end - 1 - k) == klen && memcmp(k, key, klen) == 0;
        p = ws(end);
        if (*p != ':')
            return NULL;
        p = ws(p + 1);
        if (match)
            return p;
        if ((p = skip_value(p, 1)) == NULL)
            return NULL;
        p = ws(p);
        if (*p != ',')
            return NULL;
        p = ws(p + 1);
    }
    return NULL;
}

const char *geoJsonFirst(const char *p)
{
    p = ws(p);
    if (p == NULL || *p != '[')
        return NULL;
    p = ws(p + 1);
    return *p == ']' || *p == '\0' ? NULL : p;
}

const char *geoJsonNext(const char *p)
{
    p = ws(skip_value(p, 1));
    if (p == NULL || *p != ',')
        return NULL;
    p = ws(p + 1);
    return *p == '\0' ? NULL : p;
}

int geoJsonString(const char *p, char *out, size_t len)
{
    size_t o = 0;
    p = ws(p);
    if (p == NULL || *p != '"' || len == 0)
        return -1;
    for (p++; *p && *p != '"'; p++) {
        char c = *p;
        if (c == '\\') {
            p++;
            switch (*p) {
            case 'n': c = '\n'; break;
            case 't': c = '\t'; break;
            case 'r': c = '\r'; break;
            case 'b': c = '\b'; break;
            case 'f': c = '\f'; break;
            case 'u': {
                unsigned v = 0;
                for (int i = 1; i <= 4; i++) {
                    char d = p[i];
                    if (d >= '0' && d <= '9')
                        v = v * 16 + (unsigned)(d - '0');
                    else if ((d | 32) >= 'a' && (d | 32) <= 'f')
                        v = v * 16 + (unsigned)((d | 32) - 'a' + 10);
                    else
                        return -1;
                }
                p += 4;
                c = v < 128 ? (char)v : '?';
                break;
            }
            case '\0': return -1;
            default: c = *p; break; /* " \ / */
            }
        }
        if (o + 1 < len)
            out[o] = c;
        o++;
    }
    if (*p != '"')
        return -1;
    out[o + 1 < len ? o : len - 1] = '\0';
    return (int)o;
}

int geoJsonInt(const char *p, int64_t *out)
{
    char buf[32];
    p = ws(p);
    if (p == NULL)
        return -1;
    if (*p == '"') {
        int n = geoJsonString(p, buf, sizeof(buf));
        if (n < 0 || n >= (int)sizeof(buf))
            return -1;
    } else {
        size_t i = 0;
        while ((p[i] == '-' || (p[i] >= '0' && p[i] <= '9')) && i + 1 < sizeof(buf)) {
            buf[i] = p[i];
            i++;
        }
        /* A number longer than buf is out of range, not cut short. */
        if (p[i] == '-' || (p[i] >= '0' && p[i] <= '9'))
            return -1;
        buf[i] = '\0';
    }
    char *end;
    if (buf[0] == '\0')
        return -1;
    /* A value past int64 from the wire is an error, not LLONG_MAX. */
    errno = 0;
    long long v = strtoll(buf, &end, 10);
    if (*end != '\0' || errno == ERANGE)
        return -1;
    *out = v;
    return 0;
}
