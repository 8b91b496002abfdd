/* Same-host peers; see net_local.h for the rules and their reasons. */
#include "config.h"
#include "comm/transport/net_local.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

void geoLocalIdentify(geoLocalInfo *me)
{
    struct stat sb;

    memset(me, 0, sizeof(*me));
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "re");
    if (f != NULL) {
        if (fgets(me->boot_id, sizeof(me->boot_id), f) == NULL)
            me->boot_id[0] = '\0';
        me->boot_id[strcspn(me->boot_id, "\n")] = '\0';
        fclose(f);
    }
    if (stat("/proc/self/ns/net", &sb) == 0) {
        me->netns_dev = (uint64_t)sb.st_dev;
        me->netns_ino = (uint64_t)sb.st_ino;
    }
}

/* tmpfs when there is one: the file never touches a disk. */
static const char *local_dir(void)
{
    return access("/dev/shm", W_OK | X_OK) == 0 ? "/dev/shm" : "/tmp";
}

int geoLocalListen(int rank, int *fd, geoLocalInfo *me)
{
    struct sockaddr_un sun;
    char dir[GEO_LOCAL_PATH_LEN];
    int s, err;

    /* A 0700 directory of our own, so the socket is never reachable by
     * other users, even for the instant between bind and chmod. */
    snprintf(dir, sizeof(dir), "%s/geoccl-XXXXXX", local_dir());
    if (mkdtemp(dir) == NULL)
        return -1;
    memset(&sun, 0, sizeof(sun));
    sun.sun_family = AF_UNIX;
    if ((size_t)snprintf(sun.sun_path, sizeof(sun.sun_path), "%s/r%d", dir, rank) >=
        sizeof(sun.sun_path)) {
        rmdir(dir);
        errno = ENAMETOOLONG;
        return -1;
    }
    s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (s < 0)
        goto err_rmdir;
    if (bind(s, (struct sockaddr *)&sun, sizeof(sun)) != 0)
        goto err_close;
    if (chmod(sun.sun_path, 0600) != 0 || listen(s, SOMAXCONN) != 0)
        goto err_unlink;
    memcpy(me->path, sun.sun_path, sizeof(me->path));
    *fd = s;
    return 0;

err_unlink:
    err = errno;
    unlink(sun.sun_path);
    errno = err;
err_close:
    err = errno;
    close(s);
    errno = err;
err_rmdir:
    err = errno;
    rmdir(dir);
    errno = err;
    return -1;
}

void geoLocalUnlink(geoLocalInfo *me)
{
    if (me->path[0] == '\0')
        return;
    unlink(me->path);
    char *slash = strrchr(me->path, '/');
    if (slash != NULL) {
        *slash = '\0';
        rmdir(me->path);
    }
    me->path[0] = '\0';
}

int geoLocalSamePlace(const geoLocalInfo *me, const geoLocalInfo *peer)
{
    return me->path[0] != '\0' && peer->path[0] != '\0' && me->boot_id[0] != '\0' &&
           strncmp(me->boot_id, peer->boot_id, sizeof(me->boot_id)) == 0 &&
           (me->netns_dev | me->netns_ino) != 0 && me->netns_dev == peer->netns_dev &&
           me->netns_ino == peer->netns_ino;
}

int geoLocalConnectStart(const char *path, int *fd)
{
    struct sockaddr_un sun;
    int s, err;

    memset(&sun, 0, sizeof(sun));
    sun.sun_family = AF_UNIX;
    if (memchr(path, '\0', sizeof(sun.sun_path)) == NULL) {
        errno = ENAMETOOLONG;
        return -1;
    }
    memcpy(sun.sun_path, path, strlen(path));
    s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (s < 0)
        return -1;
    if (connect(s, (struct sockaddr *)&sun, sizeof(sun)) == 0 || errno == EINPROGRESS) {
        *fd = s;
        return 0;
    }
    err = errno;
    close(s);
    errno = err;
    return -1;
}
