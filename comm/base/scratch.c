/* Scratch buffers kept between calls; see scratch.h. */
#include "config.h"
#include "comm/base/scratch.h"

#include <stdlib.h>
#include <string.h>

void geoScratchInit(geoScratch *s)
{
    memset(s, 0, sizeof(*s));
    pthread_mutex_init(&s->lock, NULL);
}

void geoScratchFree(geoScratch *s)
{
    for (int i = 0; i < GEO_SCRATCH_SLOTS; i++)
        free(s->buf[i].p);
    pthread_mutex_destroy(&s->lock);
    memset(s, 0, sizeof(*s));
}

void *geoScratchGet(geoScratch *s, size_t bytes)
{
    void *p = NULL;
    int best = -1, empty = -1, spare = -1;

    if (bytes == 0)
        bytes = 1;
    pthread_mutex_lock(&s->lock);
    for (int i = 0; i < GEO_SCRATCH_SLOTS; i++) {
        if (s->buf[i].p == NULL) {
            empty = empty < 0 ? i : empty;
        } else if (!s->buf[i].busy) {
            if (s->buf[i].size >= bytes && (best < 0 || s->buf[i].size < s->buf[best].size))
                best = i;
            else if (s->buf[i].size < bytes && (spare < 0 || s->buf[i].size < s->buf[spare].size))
                spare = i;
        }
    }
    if (best >= 0) {
        s->buf[best].busy = 1;
        p = s->buf[best].p;
    } else {
        /* Replace the smallest idle buffer that is too small, else take an
         * empty slot, if the bytes kept stay within the bound. */
        int slot = spare >= 0 ? spare : empty;
        size_t old = slot >= 0 && s->buf[slot].p ? s->buf[slot].size : 0;
        if (slot >= 0 && s->kept - old + bytes <= GEO_SCRATCH_MAX_BYTES) {
            p = malloc(bytes);
            if (p != NULL) {
                free(s->buf[slot].p);
                s->kept = s->kept - old + bytes;
                s->buf[slot].p = p;
                s->buf[slot].size = bytes;
                s->buf[slot].busy = 1;
            }
        } else {
            p = malloc(bytes); /* not kept */
        }
    }
    pthread_mutex_unlock(&s->lock);
    return p;
}

void geoScratchPut(geoScratch *s, void *p)
{
    if (p == NULL)
        return;
    pthread_mutex_lock(&s->lock);
    for (int i = 0; i < GEO_SCRATCH_SLOTS; i++)
        if (s->buf[i].p == p) {
            s->buf[i].busy = 0;
            pthread_mutex_unlock(&s->lock);
            return;
        }
    pthread_mutex_unlock(&s->lock);
    free(p);
}
