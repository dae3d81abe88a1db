/* libcuda.so of the gpukit lab's stand-in NVIDIA driver.
 *
 * A CUDA program loads libcuda.so.1 and calls cuInit, then asks how many devices it has. A
 * real driver answers from the device nodes the process may open: /dev/nvidiactl, one
 * /dev/nvidia<minor> per GPU, and for MIG the /dev/nvidia-caps nodes of its GPU and compute
 * instances. This stand-in answers from the same nodes, so inside a container it sees exactly
 * the GPUs the runtime (or CDI) gave it:
 *
 * - a node counts when open() does not refuse it for permission (EPERM/EACCES: the device
 *   cgroup or the file mode); the lab's nodes have no kernel driver behind them, so ENXIO or
 *   ENODEV means "present and allowed";
 * - a compute instance's caps node (minor 3 + 135 * gpu + 9 * gi + 1 + ci, the driver's
 *   fixed table, /proc/driver/nvidia-caps/mig-minors) with its GPU instance's node and its
 *   GPU's node is one MIG device, and that GPU then is not a whole device;
 * - without /dev/nvidiactl, or with no device, cuInit fails with CUDA_ERROR_NO_DEVICE.
 *
 * cuDriverGetVersion reports the CUDA version the driver branch supports (STANDIN_CUDA_VERSION,
 * set per branch at build time). GPUKIT_LAB_CUDA_DEV_ROOT replaces /dev (tests).
 * Only libc, and only symbols old enough for any glibc the lab meets.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifndef STANDIN_CUDA_VERSION
#define STANDIN_CUDA_VERSION 12040
#endif

typedef int CUresult;
typedef int CUdevice;

enum {
    CUDA_SUCCESS = 0,
    CUDA_ERROR_INVALID_VALUE = 1,
    CUDA_ERROR_NOT_INITIALIZED = 3,
    CUDA_ERROR_NO_DEVICE = 100,
    CUDA_ERROR_INVALID_DEVICE = 101,
};

#define MAX_GPUS 64
#define CAPS_FIRST 3   /* minors 1 and 2: config and monitor */
#define CAPS_PER_GI 9  /* the GI's access + 8 compute instances */
#define CAPS_PER_GPU (15 * CAPS_PER_GI)
#define MAX_DEVICES (MAX_GPUS * 15 * 8)

static int initialized;
static int device_count;

static const char *dev_root(void) {
    const char *root = getenv("GPUKIT_LAB_CUDA_DEV_ROOT");
    return root && *root ? root : "/dev";
}

/* Present and not refused: the process may use this node. */
static int usable(const char *name) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dev_root(), name);
    int fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd >= 0) {
        close(fd);
        return 1;
    }
    if (errno == ENXIO || errno == ENODEV)
        return 1;
    if (errno == EACCES || errno == EPERM) {  /* caps nodes are read-only (0444) */
        fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd >= 0) {
            close(fd);
            return 1;
        }
        return errno == ENXIO || errno == ENODEV;
    }
    return 0;
}

/* "<prefix><number>" -> number, or -1. */
static long suffix_number(const char *name, const char *prefix) {
    size_t n = strlen(prefix);
    if (strncmp(name, prefix, n) != 0 || name[n] == '\0')
        return -1;
    char *end;
    long v = strtol(name + n, &end, 10);
    return *end == '\0' && v >= 0 ? v : -1;
}

static int count_devices(void) {
    static unsigned char gpu[MAX_GPUS], gi_cap[MAX_GPUS][15], mig_gpu[MAX_GPUS];
    static int ci_caps[MAX_DEVICES][3];
    int n_ci = 0, count = 0;
    char path[512];

    memset(gpu, 0, sizeof gpu);
    memset(gi_cap, 0, sizeof gi_cap);
    memset(mig_gpu, 0, sizeof mig_gpu);
    DIR *d = opendir(dev_root());
    if (!d)
        return 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        long minor = suffix_number(e->d_name, "nvidia");
        if (minor >= 0 && minor < MAX_GPUS && usable(e->d_name))
            gpu[minor] = 1;
    }
    closedir(d);

    snprintf(path, sizeof path, "%s/nvidia-caps", dev_root());
    d = opendir(path);
    if (d) {
        while ((e = readdir(d)) != NULL) {
            long minor = suffix_number(e->d_name, "nvidia-cap");
            if (minor < CAPS_FIRST)
                continue;
            long rel = minor - CAPS_FIRST, g = rel / CAPS_PER_GPU;
            long gi = (rel % CAPS_PER_GPU) / CAPS_PER_GI, slot = rel % CAPS_PER_GI;
            char name[300];
            snprintf(name, sizeof name, "nvidia-caps/%s", e->d_name);
            if (g >= MAX_GPUS || !usable(name))
                continue;
            if (slot == 0)
                gi_cap[g][gi] = 1;
            else if (n_ci < MAX_DEVICES) {
                ci_caps[n_ci][0] = (int)g;
                ci_caps[n_ci][1] = (int)gi;
                ci_caps[n_ci][2] = (int)slot - 1;
                n_ci++;
            }
        }
        closedir(d);
    }
    for (int i = 0; i < n_ci; i++) {
        int g = ci_caps[i][0], gi = ci_caps[i][1];
        if (gpu[g] && gi_cap[g][gi]) {
            mig_gpu[g] = 1;
            count++;
        }
    }
    for (int g = 0; g < MAX_GPUS; g++)
        if (gpu[g] && !mig_gpu[g])
            count++;
    return count;
}

CUresult cuInit(unsigned int flags) {
    if (flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (!usable("nvidiactl"))
        return CUDA_ERROR_NO_DEVICE;
    device_count = count_devices();
    if (device_count == 0)
        return CUDA_ERROR_NO_DEVICE;
    initialized = 1;
    return CUDA_SUCCESS;
}

CUresult cuDriverGetVersion(int *version) {
    if (!version)
        return CUDA_ERROR_INVALID_VALUE;
    *version = STANDIN_CUDA_VERSION;
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetCount(int *count) {
    if (!count)
        return CUDA_ERROR_INVALID_VALUE;
    if (!initialized)
        return CUDA_ERROR_NOT_INITIALIZED;
    *count = device_count;
    return CUDA_SUCCESS;
}

CUresult cuDeviceGet(CUdevice *device, int ordinal) {
    if (!device)
        return CUDA_ERROR_INVALID_VALUE;
    if (!initialized)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (ordinal < 0 || ordinal >= device_count)
        return CUDA_ERROR_INVALID_DEVICE;
    *device = ordinal;
    return CUDA_SUCCESS;
}

CUresult cuGetErrorName(CUresult error, const char **name) {
    if (!name)
        return CUDA_ERROR_INVALID_VALUE;
    switch (error) {
    case CUDA_SUCCESS: *name = "CUDA_SUCCESS"; break;
    case CUDA_ERROR_INVALID_VALUE: *name = "CUDA_ERROR_INVALID_VALUE"; break;
    case CUDA_ERROR_NOT_INITIALIZED: *name = "CUDA_ERROR_NOT_INITIALIZED"; break;
    case CUDA_ERROR_NO_DEVICE: *name = "CUDA_ERROR_NO_DEVICE"; break;
    case CUDA_ERROR_INVALID_DEVICE: *name = "CUDA_ERROR_INVALID_DEVICE"; break;
    default: *name = NULL; return CUDA_ERROR_INVALID_VALUE;
    }
    return CUDA_SUCCESS;
}
