/* Prints the environment parameter table (comm/base/param.c) as a markdown
 * table: one row per parameter with its name, type, default, help and NCCL
 * twins (with how their value maps), then the NCCL variables accepted with
 * no twin.
 * tests/helpers/gen_env_doc.sh puts it under the fixed intro of docs/environment.md,
 * and tests/test_env_doc.sh fails when that page differs from what it
 * produces.  Rows are sorted by name, so the page does not change when the
 * enum is reordered.  It reads the table through geoParamDescribe, so the compiler,
 * not a parser of C text, says what the table holds. */
#include "config.h"
#include "comm/base/param.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Markdown would read '|' as a cell border, '<...>' as HTML and '*' or a
 * backquote as emphasis or code: escape them so the help reads as written. */
static void put_text(const char *s)
{
    for (; *s; s++) {
        if (*s == '|' || *s == '<' || *s == '>' || *s == '*' || *s == '`' || *s == '\\')
            putchar('\\');
        putchar(*s);
    }
}

static int by_name(const void *a, const void *b)
{
    const geoParamDesc *x = *(const geoParamDesc *const *)a;
    const geoParamDesc *y = *(const geoParamDesc *const *)b;
    return strcmp(x->name, y->name);
}

/* The NCCL twins of a parameter and how their value maps, in one cell. */
static void put_twins(const geoParamDesc *d)
{
    if (d->nccl == NULL) {
        printf("-");
        return;
    }
    for (int k = 0; d->nccl[k] != NULL; k++)
        printf("%s`%s`", k ? ", " : "", d->nccl[k]);
    printf(": ");
    put_text(d->nccl_map ? d->nccl_map : "taken as it is");
}

int main(void)
{
    const geoParamDesc *rows[GEO_PARAM_COUNT];

    for (int i = 0; i < GEO_PARAM_COUNT; i++) {
        rows[i] = geoParamDescribe((geoParamId)i);
        if (rows[i] == NULL || rows[i]->name == NULL) {
            fprintf(stderr, "gen_env_table: parameter %d has no entry in the table\n", i);
            return 1;
        }
    }
    qsort(rows, GEO_PARAM_COUNT, sizeof rows[0], by_name);

    printf("| variable | type | default | meaning | NCCL twin |\n");
    printf("| --- | --- | --- | --- | --- |\n");
    for (int i = 0; i < GEO_PARAM_COUNT; i++) {
        const geoParamDesc *d = rows[i];
        printf("| `%s` | %s | ", d->name, d->type == GEO_PARAM_INT ? "integer" : "string");
        if (d->dflt)
            printf("`%s`", d->dflt);
        else
            printf("unset");
        printf(" | ");
        put_text(d->help ? d->help : "");
        printf(" | ");
        put_twins(d);
        printf(" |\n");
    }

    /* NCCL variables with no twin that GeoCCL accepts. */
    const char *name, *how;
    int id, shown = 0;
    for (int i = 0; (name = geoParamNcclVar(i, &id, &how)) != NULL; i++) {
        if (id >= 0)
            continue;
        if (shown++ == 0) {
            printf("\nNCCL variables with no GEOCCL_ twin that GeoCCL accepts:\n\n");
            printf("| variable | what GeoCCL makes of it |\n");
            printf("| --- | --- |\n");
        }
        printf("| `%s` | ", name);
        put_text(how);
        printf(" |\n");
    }
    return 0;
}
