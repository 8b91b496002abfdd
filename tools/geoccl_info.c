/* geoccl-info: prints GeoCCL's version and every environment parameter
 * with its value in force, default and help (like ucx_info -c). */
#include <stdio.h>
#include <string.h>

#include "geoccl.h"
#include "nccl.h"

int main(int argc, char **argv)
{
    int v = 0;
    if (argc > 1 && (strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0)) {
        printf("usage: geoccl-info\n  prints GeoCCL's version and its environment parameters\n");
        return 0;
    }
    ncclGetVersion(&v);
    printf("GeoCCL %s (NCCL API %d)\n\n", geocclVersionString(), v);
    printf("%-24s %-12s %-10s %s\n", "parameter", "value", "default", "meaning");
    for (int i = 0; i < geocclParamCount(); i++) {
        geocclParamInfo p;
        if (geocclParamGet(i, &p) != ncclSuccess)
            return 1;
        printf("%-24s %-12s %-10s %s%s\n", p.name, p.value ? p.value : "-",
               p.dflt ? p.dflt : "-", p.help, p.is_set ? " [set]" : "");
    }
    return 0;
}
