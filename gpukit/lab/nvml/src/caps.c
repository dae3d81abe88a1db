/*
 * gpukit mock NVML: the driver's MIG capability files, as the nvidia-caps part of a real driver
 * shows them in /proc/driver/nvidia/capabilities.
 *
 * The lab's stand-in driver keeps the tree in $STATE_DIR/proc-driver/nvidia/capabilities (a lab
 * node bind-mounts $STATE_DIR/proc-driver over its /proc/driver, gpukit/lab/node/boot.sh), so whoever
 * changes the MIG state through this library (the MIG manager, nvidia-smi, any NVML client,
 * in the node or in a container with the state directory mounted) also changes what GPU
 * consumers read there:
 *
 *   mig/config, mig/monitor                       always
 *   gpu<minor>/mig/                               every MIG-capable GPU
 *   gpu<minor>/mig/gi<G>/access                   each GPU instance that exists
 *   gpu<minor>/mig/gi<G>/ci<C>/access             each compute instance that exists
 *
 * Each access file reads "DeviceFileMinor: N\nDeviceFileMode: M\nDeviceFileModify: 1\n", the
 * mode in decimal; N is the minor of /dev/nvidia-caps/nvidia-cap<N> from the driver's fixed table
 * (/proc/driver/nvidia-caps/mig-minors, rendered by gpukit.lab.driver_surface, which mirrors
 * mock_caps_minor below).
 *
 * At a node's boot (gpukitMockBoot) the rest of the driver's /proc/driver is written too, from
 * the profile as it is then (a driver package changes its driver_version): nvidia/version,
 * nvidia/gpus/<bus id>/information, nvidia-caps/mig-minors (caps_render_static).
 *
 * The tree is rebuilt whole after every state commit, under the state lock: written into
 * capabilities.new, swapped with capabilities (renameat2 RENAME_EXCHANGE, so a reader sees the
 * old tree or the new one), the old one removed. $STATE_DIR/caps-serial records the state serial
 * the tree shows; a writer that finds it behind the state (a writer killed between the state's
 * rename and the tree's) rebuilds it when it takes the lock.
 */
#include "mock.h"

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

unsigned mock_caps_minor(unsigned gpu_minor, unsigned gi, unsigned ci)
{
    unsigned m = MOCK_CAPS_FIRST_GPU_MINOR + gpu_minor * MOCK_CAPS_PER_GPU + gi * MOCK_CAPS_PER_GI;
    return ci == MOCK_NO_ID ? m : m + 1 + ci;
}

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)ftw;
    return (flag == FTW_DP ? rmdir(path) : unlink(path)) && errno != ENOENT ? -1 : 0;
}

static int rm_tree(const char *path)
{
    struct stat st;
    if (lstat(path, &st) && errno == ENOENT)
        return 0;
    return nftw(path, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}

static int mkdir_one(const char *path)
{
    return mkdir(path, 0755) && errno != EEXIST ? -1 : 0;
}

static int write_file(const char *path, const char *text)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0444);
    if (fd < 0)
        return -1;
    size_t n = strlen(text);
    ssize_t w = write(fd, text, n);
    int bad = w < 0 || (size_t)w != n;
    return close(fd) || bad ? -1 : 0;
}

static int write_cap(const char *path, unsigned minor, unsigned mode)
{
    char text[128];
    snprintf(text, sizeof text, "DeviceFileMinor: %u\nDeviceFileMode: %u\nDeviceFileModify: 1\n",
             minor, mode);
    return write_file(path, text);
}

/* Build the tree for g_state under dir (which does not exist yet). */
static int build(const char *dir)
{
    char p[PATH_MAX + 96];
    if (mkdir_one(dir))
        return -1;
    snprintf(p, sizeof p, "%s/mig", dir);
    if (mkdir_one(p))
        return -1;
    snprintf(p, sizeof p, "%s/mig/config", dir);
    if (write_cap(p, MOCK_CAPS_CONFIG_MINOR, 0400))
        return -1;
    snprintf(p, sizeof p, "%s/mig/monitor", dir);
    if (write_cap(p, MOCK_CAPS_MONITOR_MINOR, 0444))
        return -1;
    for (unsigned i = 0; i < g_prof.ngpu; i++) {
        const mock_gpu *gp = &g_prof.gpu[i];
        const mock_gpu_state *gs = &g_state.gpu[i];
        if (!gp->mig)
            continue;
        snprintf(p, sizeof p, "%s/gpu%u", dir, gp->minor);
        if (mkdir_one(p))
            return -1;
        snprintf(p, sizeof p, "%s/gpu%u/mig", dir, gp->minor);
        if (mkdir_one(p))
            return -1;
        for (unsigned g = 0; g < MOCK_MAX_GI; g++) {
            const mock_gi_state *gi = &gs->gi[g];
            if (!gi->used)
                continue;
            snprintf(p, sizeof p, "%s/gpu%u/mig/gi%u", dir, gp->minor, g);
            if (mkdir_one(p))
                return -1;
            snprintf(p, sizeof p, "%s/gpu%u/mig/gi%u/access", dir, gp->minor, g);
            if (write_cap(p, mock_caps_minor(gp->minor, g, MOCK_NO_ID), 0444))
                return -1;
            for (unsigned c = 0; c < MOCK_MAX_CI; c++) {
                if (!gi->ci[c].used)
                    continue;
                snprintf(p, sizeof p, "%s/gpu%u/mig/gi%u/ci%u", dir, gp->minor, g, c);
                if (mkdir_one(p))
                    return -1;
                snprintf(p, sizeof p, "%s/gpu%u/mig/gi%u/ci%u/access", dir, gp->minor, g, c);
                if (write_cap(p, mock_caps_minor(gp->minor, g, c), 0444))
                    return -1;
            }
        }
    }
    return 0;
}

static int swap_in(const char *next, const char *cur);
static int replace_file(const char *path, const char *text);

static void serial_path(char *out, size_t n) { snprintf(out, n, "%s/caps-serial", g_state_dir); }

/* The state serial the capability tree was last built for (0: none). */
static unsigned long long built_serial(void)
{
    char path[PATH_MAX + 16], buf[32] = "";
    serial_path(path, sizeof path);
    FILE *f = fopen(path, "re");
    if (!f)
        return 0;
    if (!fgets(buf, sizeof buf, f))
        buf[0] = 0;
    fclose(f);
    return strtoull(buf, NULL, 10);
}

nvmlReturn_t caps_render(void)
{
    char base[PATH_MAX + 32], cur[PATH_MAX + 64], next[PATH_MAX + 64];
    snprintf(base, sizeof base, "%s/proc-driver", g_state_dir);
    snprintf(cur, sizeof cur, "%s/nvidia/capabilities", base);
    snprintf(next, sizeof next, "%s/nvidia/capabilities.new", base);
    if (mkdir_one(base))
        goto fail;
    snprintf(next, sizeof next, "%s/nvidia", base);
    if (mkdir_one(next))
        goto fail;
    snprintf(next, sizeof next, "%s/nvidia/capabilities.new", base);
    if (rm_tree(next) || build(next))
        goto fail;
    if (swap_in(next, cur))
        goto fail;
    char path[PATH_MAX + 16], tmp[PATH_MAX + 32], text[32];
    serial_path(path, sizeof path);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    snprintf(text, sizeof text, "%llu\n", g_state.serial);
    if (replace_file(path, text))
        goto fail;
    return NVML_SUCCESS;
fail:
    mock_report_error("cannot write the MIG capability files in %s: %s", base, strerror(errno));
    return NVML_ERROR_UNKNOWN;
}

nvmlReturn_t caps_repair(void)
{
    return built_serial() == g_state.serial ? NVML_SUCCESS : caps_render();
}

/* The sysfs form of a GPU's bus id: 0000:07:00.0 (4-digit domain, lowercase). */
static void sysfs_bus_id(const mock_gpu *g, char *out, size_t n)
{
    snprintf(out, n, "%04x:%02x:%02x.0", g->domain, g->bus, g->device);
}

static int replace_file(const char *path, const char *text)
{
    char tmp[PATH_MAX + 80];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    if (unlink(tmp) && errno != ENOENT)
        return -1;
    return write_file(tmp, text) || rename(tmp, path) ? -1 : 0;
}

/* Swap a freshly built directory `next` in for `cur`, then remove the old one. */
static int swap_in(const char *next, const char *cur)
{
    if (renameat2(AT_FDCWD, next, AT_FDCWD, cur, RENAME_EXCHANGE)) {
        if (errno != ENOENT && errno != EINVAL && errno != ENOSYS)
            return -1;
        return rm_tree(cur) || rename(next, cur) ? -1 : 0;
    }
    return rm_tree(next);
}

static int build_gpus(const char *dir)
{
    char p[2 * PATH_MAX], bus[32], *text = NULL;
    if (mkdir_one(dir))
        return -1;
    for (unsigned i = 0; i < g_prof.ngpu; i++) {
        const mock_gpu *g = &g_prof.gpu[i];
        sysfs_bus_id(g, bus, sizeof bus);
        snprintf(p, sizeof p, "%s/%s", dir, bus);
        if (mkdir_one(p))
            return -1;
        if (asprintf(&text,
                     "Model: \t\t %s\nIRQ:   \t\t %u\nGPU UUID: \t %s\nVideo BIOS: \t %s\n"
                     "Bus Type: \t PCIe\nDMA Size: \t 47 bits\nDMA Mask: \t 0x7fffffffffff\n"
                     "Bus Location: \t %s\nDevice Minor: \t %u\nGPU Excluded:\t No\n",
                     g->name, MOCK_IRQ_BASE + i, g->uuid, g->vbios, bus, g->minor) < 0)
            return -1;
        snprintf(p, sizeof p, "%s/%s/information", dir, bus);
        int rc = write_file(p, text);
        free(text);
        if (rc)
            return -1;
    }
    return 0;
}

static char *mig_minors_text(void)
{
    unsigned ngpu = MOCK_CAPS_TABLE_GPUS;
    for (unsigned i = 0; i < g_prof.ngpu; i++)
        if (g_prof.gpu[i].minor + 1 > ngpu)
            ngpu = g_prof.gpu[i].minor + 1;
    char *buf = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&buf, &len);
    if (!m)
        return NULL;
    fprintf(m, "config %u\nmonitor %u\n", MOCK_CAPS_CONFIG_MINOR, MOCK_CAPS_MONITOR_MINOR);
    for (unsigned gpu = 0; gpu < ngpu; gpu++)
        for (unsigned gi = 0; gi < MOCK_MAX_GI; gi++) {
            fprintf(m, "gpu%u/gi%u/access %u\n", gpu, gi, mock_caps_minor(gpu, gi, MOCK_NO_ID));
            for (unsigned ci = 0; ci < MOCK_MAX_CI; ci++)
                fprintf(m, "gpu%u/gi%u/ci%u/access %u\n", gpu, gi, ci,
                        mock_caps_minor(gpu, gi, ci));
        }
    fclose(m);
    return buf;
}

nvmlReturn_t caps_render_static(void)
{
    char base[PATH_MAX + 32], p[PATH_MAX + 64], q[PATH_MAX + 64], *text = NULL;
    snprintf(base, sizeof base, "%s/proc-driver", g_state_dir);
    snprintf(p, sizeof p, "%s/nvidia", base);
    if (mkdir_one(base) || mkdir_one(p))
        goto fail;
    snprintf(p, sizeof p, "%s/nvidia-caps", base);
    if (mkdir_one(p))
        goto fail;
    if (asprintf(&text,
                 "NVRM version: NVIDIA UNIX x86_64 Kernel Module  %s  " MOCK_DRIVER_BUILD_DATE
                 "\nGCC version:  " MOCK_DRIVER_GCC "\n",
                 g_prof.driver_version) < 0)
        goto fail;
    snprintf(p, sizeof p, "%s/nvidia/version", base);
    int rc = replace_file(p, text);
    free(text);
    if (rc)
        goto fail;
    snprintf(p, sizeof p, "%s/nvidia/gpus.new", base);
    snprintf(q, sizeof q, "%s/nvidia/gpus", base);
    if (rm_tree(p) || build_gpus(p) || swap_in(p, q))
        goto fail;
    if (!(text = mig_minors_text()))
        goto fail;
    snprintf(p, sizeof p, "%s/nvidia-caps/mig-minors", base);
    rc = replace_file(p, text);
    free(text);
    if (rc)
        goto fail;
    return NVML_SUCCESS;
fail:
    mock_report_error("cannot write the driver's files in %s: %s", base, strerror(errno));
    return NVML_ERROR_UNKNOWN;
}
