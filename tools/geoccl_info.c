/* geoccl-info: prints GeoCCL's version, every environment parameter with
 * its value in force, default and help (like ucx_info -c), and the NCCL
 * variables GeoCCL reads in their place with how each maps. */
#include <stdio.h>
#include <string.h>

#include "geoccl.h"
#include "nccl.h"

int main(int argc, char **argv)
{
    int v = 0;
    if (argc > 1 && (strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0)) {
        printf("usage: geoccl-info\n  prints GeoCCL's version, its environment parameters and "
               "the NCCL variables read in their place\n");
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
    printf("\nNCCL variables, read when the GEOCCL_ one is unset (it wins when both are "
           "set):\n");
    printf("%-24s %-24s %s\n", "NCCL variable", "read as", "how");
    for (int i = 0; i < geocclNcclVarCount(); i++) {
        geocclNcclVarInfo n;
        if (geocclNcclVarGet(i, &n) != ncclSuccess)
            return 1;
        printf("%-24s %-24s %s", n.name, n.geoccl ? n.geoccl : "-", n.how);
        if (n.value)
            printf(" [set: %s]", n.value);
        printf("\n");
    }
    return 0;
}
