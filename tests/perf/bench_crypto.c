/* What encrypting frames costs a CPU: each cipher GeoCCL can use seals and
 * opens frames of the transport's size (256 KiB, with a 40-byte header as
 * associated data) through the same calls as the TCP transport
 * (comm/base/crypto.h), and this prints CPU seconds per GiB each way and
 * the rate one core reaches.
 *
 *   bench-crypto [GIB]      (default 1 GiB per cipher and direction)
 *
 * Every opened frame is compared with what was sealed, so a figure never
 * comes from a cipher that failed. */
#include "config.h"
#include "comm/base/crypto.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define FRAME (256 * 1024)

static double cpu_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int main(int argc, char **argv)
{
    double gib = argc > 1 ? atof(argv[1]) : 1.0;
    size_t frames = (size_t)(gib * (1 << 30) / FRAME);
    uint8_t key[GEO_AEAD_KEY_BYTES], hdr[40];
    uint8_t *pt = malloc(FRAME), *ct = malloc(FRAME + GEO_AEAD_TAG_BYTES), *back = malloc(FRAME);
    const int ciphers[2] = {GEO_CIPHER_AES256GCM, GEO_CIPHER_CHACHA20POLY1305};

    if (pt == NULL || ct == NULL || back == NULL || frames == 0 || geoRandomBytes(key, sizeof(key)) ||
        geoRandomBytes(pt, FRAME)) {
        fprintf(stderr, "bench-crypto: usage: bench-crypto [GIB > 0]; or out of memory\n");
        return 2;
    }
    memset(hdr, 7, sizeof(hdr));
    printf("# %zu frames of %d KiB per cipher and direction; this CPU prefers %s\n", frames,
           FRAME / 1024, geoCipherName(geoCipherPreferred()));
    printf("| cipher | seal: CPU s/GiB | seal: GiB/s per core | open: CPU s/GiB | open: GiB/s per core |\n");
    printf("|---|---:|---:|---:|---:|\n");
    for (int c = 0; c < 2; c++) {
        geoAead tx, rx;
        double seal = 0, open = 0;
        if (geoAeadInit(&tx, ciphers[c], key, 1) != 0 || geoAeadInit(&rx, ciphers[c], key, 0) != 0) {
            fprintf(stderr, "bench-crypto: %s unavailable\n", geoCipherName(ciphers[c]));
            return 1;
        }
        for (size_t k = 0; k < frames; k++) {
            double t0 = cpu_now();
            if (geoAeadSeal(&tx, k, hdr, sizeof(hdr), pt, ct, FRAME, ct + FRAME) != 0)
                return 1;
            double t1 = cpu_now();
            if (geoAeadOpen(&rx, k, hdr, sizeof(hdr), ct, back, FRAME, ct + FRAME) != 0)
                return 1;
            open += cpu_now() - t1;
            seal += t1 - t0;
            if (k == 0 && memcmp(pt, back, FRAME) != 0) {
                fprintf(stderr, "bench-crypto: %s gave back other bytes\n",
                        geoCipherName(ciphers[c]));
                return 1;
            }
        }
        double g = (double)frames * FRAME / (1 << 30);
        printf("| %s | %.3f | %.2f | %.3f | %.2f |\n", geoCipherName(ciphers[c]), seal / g,
               g / seal, open / g, g / open);
        geoAeadFree(&tx);
        geoAeadFree(&rx);
    }
    free(pt);
    free(ct);
    free(back);
    return 0;
}
