/* gpu-work: the lab's GPU workload. It "uses" the GPUs and MIG devices its container may open,
 * so the mock NVML shows it as a compute process there, for exactly as long as it runs.
 *
 * On a real node the kernel driver knows which processes hold a GPU context; the lab's stand-in
 * driver has no kernel module, so the workload tells the mock NVML itself: for each device it
 * may open it writes a client file into the mock's clients directory (the node's
 * $STATE_DIR/clients, mounted into the pod) and holds a POSIX write lock on it until it exits.
 * Readers count a client only while its lock is held: the kernel releases it when the process
 * ends, however it ends (exit, SIGKILL, the pod deleted), so attribution follows the process's
 * real lifetime. The file's mtime, touched every second, says until when it worked.
 *
 *   gpu-work [--mem-mb N] [--util PCT] [--seconds S] [--clients DIR]
 *
 * Devices, as the stand-in libcuda finds them (gpukit/lab/cuda/libcuda.c): /dev/nvidia<minor> that
 * open() does not refuse for permission (ENXIO: present, no kernel driver behind it), and for MIG
 * a compute instance's /dev/nvidia-caps/nvidia-cap<N> (N = 3 + 135 gpu + 9 gi + 1 + ci, the
 * driver's fixed table) with its GPU instance's node and its GPU's node; such a GPU is then not
 * a whole device. Prints GPU_WORK_DEVICES=<minor>[:<gi>:<ci>] ... and runs until --seconds
 * pass (0: until SIGTERM). Exit 2: no device; 3: the clients directory cannot be written.
 * GPUKIT_LAB_CUDA_DEV_ROOT replaces /dev (tests), as for the stand-in libcuda. Static, libc only.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define MAX_GPUS 64
#define MAX_DEVICES 128
#define CAPS_FIRST 3
#define CAPS_PER_GI 9
#define CAPS_PER_GPU (15 * CAPS_PER_GI)

typedef struct {
    int minor, gi, ci; /* gi, ci -1: the whole GPU */
} device;

static volatile sig_atomic_t stop;
static void on_term(int sig) { (void)sig; stop = 1; }

static int usable(const char *path)
{
    int fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd >= 0) {
        close(fd);
        return 1;
    }
    if (errno == ENXIO || errno == ENODEV)
        return 1;
    if (errno == EACCES || errno == EPERM) { /* caps nodes are read-only */
        fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd >= 0) {
            close(fd);
            return 1;
        }
        return errno == ENXIO || errno == ENODEV;
    }
    return 0;
}

static long suffix(const char *name, const char *prefix)
{
    size_t n = strlen(prefix);
    if (strncmp(name, prefix, n) || !name[n])
        return -1;
    char *end;
    long v = strtol(name + n, &end, 10);
    return *end || v < 0 ? -1 : v;
}

static const char *dev_root(void)
{
    const char *root = getenv("GPUKIT_LAB_CUDA_DEV_ROOT");
    return root && *root ? root : "/dev";
}

static int find_devices(device *out)
{
    static unsigned char gpu[MAX_GPUS], gi_cap[MAX_GPUS][15], mig[MAX_GPUS];
    device cis[MAX_DEVICES];
    int nci = 0, n = 0;
    char path[1300];
    char caps[600];
    snprintf(caps, sizeof caps, "%s/nvidia-caps", dev_root());
    DIR *d = opendir(dev_root());
    for (struct dirent *e; d && (e = readdir(d));) {
        long m = suffix(e->d_name, "nvidia");
        snprintf(path, sizeof path, "%s/%s", dev_root(), e->d_name);
        if (m >= 0 && m < MAX_GPUS && usable(path))
            gpu[m] = 1;
    }
    if (d)
        closedir(d);
    d = opendir(caps);
    for (struct dirent *e; d && (e = readdir(d));) {
        long m = suffix(e->d_name, "nvidia-cap");
        if (m < CAPS_FIRST)
            continue;
        long rel = m - CAPS_FIRST, g = rel / CAPS_PER_GPU, gi = (rel % CAPS_PER_GPU) / CAPS_PER_GI;
        long slot = rel % CAPS_PER_GI;
        snprintf(path, sizeof path, "%s/%s", caps, e->d_name);
        if (g >= MAX_GPUS || !usable(path))
            continue;
        if (slot == 0)
            gi_cap[g][gi] = 1;
        else if (nci < MAX_DEVICES)
            cis[nci++] = (device){(int)g, (int)gi, (int)slot - 1};
    }
    if (d)
        closedir(d);
    for (int i = 0; i < nci && n < MAX_DEVICES; i++)
        if (gpu[cis[i].minor] && gi_cap[cis[i].minor][cis[i].gi]) {
            mig[cis[i].minor] = 1;
            out[n++] = cis[i];
        }
    for (int g = 0; g < MAX_GPUS && n < MAX_DEVICES; g++)
        if (gpu[g] && !mig[g])
            out[n++] = (device){g, -1, -1};
    return n;
}

static int register_device(const char *dir, const device *dv, unsigned long long bytes,
                           unsigned util)
{
    char path[4200], comm[64] = "gpu-work";
    snprintf(path, sizeof path, "%s/work-XXXXXX", dir);
    int fd = mkstemp(path);
    if (fd < 0)
        return -1;
    FILE *c = fopen("/proc/self/comm", "r");
    if (c) {
        if (fgets(comm, sizeof comm, c))
            comm[strcspn(comm, "\n")] = 0;
        fclose(c);
    }
    /* Locked before it says anything: a reader finds either nothing it can parse, or a live
     * client. */
    struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = 0, .l_len = 0};
    if (fcntl(fd, F_SETLK, &fl) < 0) {
        close(fd);
        return -1;
    }
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    char gi[16] = "-", ci[16] = "-", line[512];
    if (dv->gi >= 0) {
        snprintf(gi, sizeof gi, "%d", dv->gi);
        snprintf(ci, sizeof ci, "%d", dv->ci);
    }
    int len = snprintf(line, sizeof line,
                       "gpukit-nvml-client 1 minor %d gi %s ci %s bytes %llu util %u pid %d "
                       "start %llu name %s\n",
                       dv->minor, gi, ci, bytes, util, (int)getpid(),
                       (unsigned long long)now.tv_sec * 1000000000ULL +
                           (unsigned long long)now.tv_nsec,
                       comm);
    if (write(fd, line, (size_t)len) != len || fchmod(fd, 0644)) {
        close(fd);
        return -1;
    }
    return fd;
}

int main(int argc, char **argv)
{
    unsigned long long mem_mb = 1024;
    unsigned util = 100;
    long seconds = 0;
    const char *dir = "/run/gpukit-nvml/clients";
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--mem-mb"))
            mem_mb = strtoull(argv[i + 1], NULL, 10);
        else if (!strcmp(argv[i], "--util"))
            util = (unsigned)strtoul(argv[i + 1], NULL, 10);
        else if (!strcmp(argv[i], "--seconds"))
            seconds = strtol(argv[i + 1], NULL, 10);
        else if (!strcmp(argv[i], "--clients"))
            dir = argv[i + 1];
        else {
            fprintf(stderr, "gpu-work: unknown option %s\n", argv[i]);
            return 64;
        }
    }
    if (util > 100) {
        fprintf(stderr, "gpu-work: --util %u: 0 to 100\n", util);
        return 64;
    }
    signal(SIGTERM, on_term);
    signal(SIGINT, on_term);
    device devs[MAX_DEVICES];
    int n = find_devices(devs), fds[MAX_DEVICES];
    if (n == 0) {
        printf("GPU_WORK_DEVICES=\n");
        fprintf(stderr, "gpu-work: no GPU device node this container may open\n");
        return 2;
    }
    printf("GPU_WORK_DEVICES=");
    for (int i = 0; i < n; i++) {
        fds[i] = register_device(dir, &devs[i], mem_mb << 20, util);
        if (fds[i] < 0) {
            fprintf(stderr, "gpu-work: cannot register in %s: %s\n", dir, strerror(errno));
            return 3;
        }
        if (devs[i].gi >= 0)
            printf("%s%d:%d:%d", i ? " " : "", devs[i].minor, devs[i].gi, devs[i].ci);
        else
            printf("%s%d", i ? " " : "", devs[i].minor);
    }
    printf("\nGPU_WORK_PID=%d\n", (int)getpid());
    fflush(stdout);
    time_t end = seconds > 0 ? time(NULL) + seconds : 0;
    while (!stop && (!end || time(NULL) < end)) {
        for (int i = 0; i < n; i++)
            futimens(fds[i], NULL); /* still working: what its energy counts up to */
        sleep(1);
    }
    printf("GPU_WORK_DONE=1\n");
    return 0;
}
