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
 *
 * MPS: with CUDA_MPS_PIPE_DIRECTORY set and a control daemon there (the lab's
 * nvidia-cuda-mps-control, gpukit/lab/mps/mps_control.py: a Unix socket `control`), it is an
 * MPS client, as a CUDA program is: it asks the daemon (which starts the server if none runs)
 * for its server and limits, and registers with `mps SERVER_PID` in its client files, so NVML
 * lists it among the MPS clients with its memory and the server as the process on the GPU.
 * Without a daemon there it runs without MPS, as CUDA falls back. A daemon that serves none of
 * its GPUs (its CUDA_VISIBLE_DEVICES) leaves it no device: "no CUDA-capable device is detected"
 * (cudaErrorNoDevice), exit 2. Its pinned memory limit per
 * device (by ordinal, as CUDA numbers the devices it sees) is CUDA_MPS_PINNED_DEVICE_MEM_LIMIT
 * ("0=1024M,1=2G") where lower than the daemon's default for that device; --mem-mb above it is
 * refused as cudaMalloc is: "out of memory" (cudaErrorMemoryAllocation), exit 4.
 * EXCLUSIVE_PROCESS: a GPU whose compute mode (the mock's state file beside the clients
 * directory) is EXCLUSIVE_PROCESS and that another process already holds a context on (a live
 * client file that is not an MPS client, an MPS server included) refuses it as the driver
 * refuses a second context: "all CUDA-capable devices are busy or unavailable"
 * (cudaErrorDevicesUnavailable / CUDA_ERROR_DEVICE_BUSY), exit 5.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
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

#define EXIT_OOM 4
#define EXIT_BUSY 5
#define COMPUTEMODE_EXCLUSIVE_PROCESS 3 /* nvmlComputeMode_t */

/* The MPS control daemon's answer: its server's pid and a limit per device (0: none), 0 when
 * no daemon is there (then no MPS), -1 when it serves none of these devices. */
static int mps_connect(const char *clients, const device *devs, int n, unsigned long long *limits)
{
    const char *pipe = getenv("CUDA_MPS_PIPE_DIRECTORY");
    if (!pipe || !*pipe)
        return 0;
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    if (snprintf(addr.sun_path, sizeof addr.sun_path, "%s/control", pipe) >=
        (int)sizeof addr.sun_path)
        return 0;
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return 0;
    if (connect(fd, (struct sockaddr *)&addr, sizeof addr) < 0) {
        close(fd);
        return 0;
    }
    char req[4096], rep[4096];
    int len = snprintf(req, sizeof req, "gpukit-client %d %s", (int)getpid(), clients);
    for (int i = 0; i < n && len < (int)sizeof req - 16; i++)
        len += snprintf(req + len, sizeof req - (size_t)len, " %d", devs[i].minor);
    len += snprintf(req + len, sizeof req - (size_t)len, "\n");
    size_t got = 0;
    if (write(fd, req, (size_t)len) != len) {
        close(fd);
        return 0;
    }
    for (ssize_t r; got < sizeof rep - 1 && (r = read(fd, rep + got, sizeof rep - 1 - got)) > 0;)
        got += (size_t)r;
    close(fd);
    rep[got] = 0;
    char *ts = NULL, *t = strtok_r(rep, " \n", &ts);
    if (t && !strcmp(t, "err"))
        return -1;
    if (!t || strcmp(t, "ok") || !(t = strtok_r(NULL, " \n", &ts)))
        return 0;
    int server = atoi(t);
    strtok_r(NULL, " \n", &ts); /* the active thread percentage: gpu-work has no threads to limit */
    for (int i = 0; i < n && (t = strtok_r(NULL, " \n", &ts)); i++)
        limits[i] = strtoull(t, NULL, 10);
    return server;
}

/* CUDA_MPS_PINNED_DEVICE_MEM_LIMIT="0=1024M,1=2G": the client's own limit, where lower. */
static void client_limits(unsigned long long *limits, int n)
{
    const char *env = getenv("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT");
    char buf[1024];
    snprintf(buf, sizeof buf, "%s", env ? env : "");
    char *ts = NULL;
    for (char *t = strtok_r(buf, ",", &ts); t; t = strtok_r(NULL, ",", &ts)) {
        char *eq = strchr(t, '='), *end;
        if (!eq)
            continue;
        long dev = strtol(t, NULL, 10);
        unsigned long long v = strtoull(eq + 1, &end, 10);
        v <<= *end == 'G' || *end == 'g' ? 30 : 20;
        if (dev >= 0 && dev < n && v && (!limits[dev] || v < limits[dev]))
            limits[dev] = v;
    }
}

/* The compute mode the mock's state file (beside the clients directory) gives this minor. */
static unsigned compute_mode(const char *clients, int minor)
{
    char path[4200], line[1024];
    snprintf(path, sizeof path, "%s/../state", clients);
    FILE *f = fopen(path, "r");
    unsigned mode = 0;
    while (f && fgets(line, sizeof line, f)) {
        const char *cm = strstr(line, " compute_mode "), *mi = strstr(line, " minor ");
        if (!strncmp(line, "gpu ", 4) && cm && mi && atoi(mi + 7) == minor)
            mode = (unsigned)atoi(cm + 14);
    }
    if (f)
        fclose(f);
    return mode;
}

/* Another live process holds a context on this whole GPU: a locked client file for its minor
 * that is not an MPS client's. */
static int gpu_held(const char *clients, int minor)
{
    DIR *d = opendir(clients);
    int held = 0;
    char want[32];
    snprintf(want, sizeof want, " minor %d ", minor);
    for (struct dirent *e; !held && d && (e = readdir(d));) {
        if (e->d_name[0] == '.')
            continue;
        int fd = openat(dirfd(d), e->d_name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
        if (fd < 0)
            continue;
        char text[512];
        ssize_t len = read(fd, text, sizeof text - 1);
        struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = 0, .l_len = 0};
        if (len > 0 && fcntl(fd, F_GETLK, &fl) == 0 && fl.l_type != F_UNLCK) {
            text[len] = 0;
            held = strstr(text, want) && !strstr(text, " mps ");
        }
        close(fd);
    }
    if (d)
        closedir(d);
    return held;
}

static int register_device(const char *dir, const device *dv, unsigned long long bytes,
                           unsigned util, int mps_server)
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
    char gi[16] = "-", ci[16] = "-", line[512], mps[32] = "";
    if (mps_server > 0)
        snprintf(mps, sizeof mps, " mps %d", mps_server);
    if (dv->gi >= 0) {
        snprintf(gi, sizeof gi, "%d", dv->gi);
        snprintf(ci, sizeof ci, "%d", dv->ci);
    }
    int len = snprintf(line, sizeof line,
                       "gpukit-nvml-client 1 minor %d gi %s ci %s bytes %llu util %u pid %d "
                       "start %llu name %s%s\n",
                       dv->minor, gi, ci, bytes, util, (int)getpid(),
                       (unsigned long long)now.tv_sec * 1000000000ULL +
                           (unsigned long long)now.tv_nsec,
                       comm, mps);
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
    unsigned long long limits[MAX_DEVICES] = {0};
    int server = mps_connect(dir, devs, n, limits);
    if (server < 0) {
        printf("GPU_WORK_DEVICES=\n");
        fprintf(stderr, "gpu-work: no CUDA-capable device is detected (cudaErrorNoDevice: the "
                        "MPS daemon serves none of this process's GPUs)\n");
        return 2;
    }
    if (server > 0) {
        client_limits(limits, n);
        for (int i = 0; i < n; i++)
            if (limits[i] && (mem_mb << 20) > limits[i]) {
                printf("GPU_WORK_DEVICES=\n");
                fprintf(stderr, "gpu-work: cudaMalloc of %llu MiB on device %d: out of memory "
                        "(cudaErrorMemoryAllocation; MPS pinned memory limit %llu MiB)\n",
                        mem_mb, i, limits[i] >> 20);
                return EXIT_OOM;
            }
    } else
        for (int i = 0; i < n; i++)
            if (devs[i].gi < 0 &&
                compute_mode(dir, devs[i].minor) == COMPUTEMODE_EXCLUSIVE_PROCESS &&
                gpu_held(dir, devs[i].minor)) {
                printf("GPU_WORK_DEVICES=\n");
                fprintf(stderr, "gpu-work: device %d: all CUDA-capable devices are busy or "
                        "unavailable (cudaErrorDevicesUnavailable)\n", i);
                return EXIT_BUSY;
            }
    printf("GPU_WORK_DEVICES=");
    for (int i = 0; i < n; i++) {
        fds[i] = register_device(dir, &devs[i], mem_mb << 20, util, server);
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
