#include "config.h"
#include "comm/transport/ifaces.h"

#include <ifaddrs.h>
#include <stdio.h>
#include <string.h>

static int match_list(const char *list, const char *name, int exact)
{
    char buf[256], *tok, *save = NULL;
    snprintf(buf, sizeof(buf), "%s", list);
    for (tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        if (exact ? strcmp(tok, name) == 0 : strncmp(tok, name, strlen(tok)) == 0)
            return 1;
    }
    return 0;
}

int topoIfaceMatch(const char *filter, const char *name)
{
    int exclude = 0, exact = 0;
    if (filter == NULL || *filter == '\0')
        return strncmp(name, "lo", 2) != 0 && strncmp(name, "docker", 6) != 0;
    if (*filter == '^') {
        exclude = 1;
        filter++;
    }
    if (*filter == '=') {
        exact = 1;
        filter++;
    }
    return match_list(filter, name, exact) != exclude;
}

static int same_subnet(const struct ifaddrs *ifa, const struct sockaddr *near)
{
    if (near == NULL || ifa->ifa_netmask == NULL || ifa->ifa_addr->sa_family != near->sa_family)
        return 0;
    if (near->sa_family == AF_INET) {
        uint32_t a = ((const struct sockaddr_in *)ifa->ifa_addr)->sin_addr.s_addr;
        uint32_t m = ((const struct sockaddr_in *)ifa->ifa_netmask)->sin_addr.s_addr;
        uint32_t n = ((const struct sockaddr_in *)near)->sin_addr.s_addr;
        return (a & m) == (n & m);
    }
    const uint8_t *a = ((const struct sockaddr_in6 *)ifa->ifa_addr)->sin6_addr.s6_addr;
    const uint8_t *m = ((const struct sockaddr_in6 *)ifa->ifa_netmask)->sin6_addr.s6_addr;
    const uint8_t *n = ((const struct sockaddr_in6 *)near)->sin6_addr.s6_addr;
    for (int i = 0; i < 16; i++)
        if ((a[i] & m[i]) != (n[i] & m[i]))
            return 0;
    return 1;
}

static int usable(const struct ifaddrs *ifa)
{
    if (ifa->ifa_addr == NULL || !(ifa->ifa_flags & IFF_UP))
        return 0;
    if (ifa->ifa_addr->sa_family == AF_INET6) {
        /* Link-local addresses need a scope id on every peer: skip. */
        const struct sockaddr_in6 *s = (const struct sockaddr_in6 *)ifa->ifa_addr;
        return !IN6_IS_ADDR_LINKLOCAL(&s->sin6_addr);
    }
    return ifa->ifa_addr->sa_family == AF_INET;
}

static void add(topoIface *out, int *n, int max, const struct ifaddrs *ifa)
{
    if (*n >= max)
        return;
    for (int i = 0; i < *n; i++)
        if (strcmp(out[i].name, ifa->ifa_name) == 0 &&
            out[i].addr.ss_family == ifa->ifa_addr->sa_family)
            return;
    memset(&out[*n], 0, sizeof(out[*n]));
    snprintf(out[*n].name, sizeof(out[*n].name), "%s", ifa->ifa_name);
    memcpy(&out[*n].addr, ifa->ifa_addr,
           ifa->ifa_addr->sa_family == AF_INET ? sizeof(struct sockaddr_in)
                                               : sizeof(struct sockaddr_in6));
    (*n)++;
}

int topoFindIfaces(const char *filter, const struct sockaddr *near, topoIface *out, int max)
{
    struct ifaddrs *all = NULL, *ifa;
    int n = 0;

    if (getifaddrs(&all) != 0)
        return 0;
    /* Pass 1: the interface that reaches `near` directly. */
    if (near && (filter == NULL || *filter == '\0'))
        for (ifa = all; ifa; ifa = ifa->ifa_next)
            if (usable(ifa) && same_subnet(ifa, near))
                add(out, &n, max, ifa);
    /* Pass 2 and 3: filter matches, IPv4 first. */
    for (int fam = 0; fam < 2; fam++)
        for (ifa = all; ifa; ifa = ifa->ifa_next)
            if (usable(ifa) && ifa->ifa_addr->sa_family == (fam ? AF_INET6 : AF_INET) &&
                topoIfaceMatch(filter, ifa->ifa_name))
                add(out, &n, max, ifa);
    /* Last resort without a filter: loopback. */
    if (n == 0 && (filter == NULL || *filter == '\0'))
        for (ifa = all; ifa; ifa = ifa->ifa_next)
            if (usable(ifa) && strncmp(ifa->ifa_name, "lo", 2) == 0)
                add(out, &n, max, ifa);
    freeifaddrs(all);
    return n;
}
