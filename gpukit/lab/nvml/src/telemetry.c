/*
 * gpukit mock NVML: what a GPU is doing, and the telemetry that follows from it.
 *
 * Work on a GPU comes from two places:
 * - process records in the state file (`set-processes`, gpukitMockSetProcess): pid, memory,
 *   utilisation share, start time; they stay until cleared, as a lab operator said;
 * - client files of the lab workload ($STATE_DIR/clients/<name>, written by gpukit/lab/nvml/workload):
 *   a process in a pod that can open a GPU's device node registers itself there and holds a
 *   POSIX write lock on its file for as long as it lives. The kernel drops the lock when the
 *   process ends however it ends, so a reader counts a client only while F_GETLK finds the lock
 *   held: attribution follows the real process lifetime. F_GETLK also names the holder's pid
 *   in the reader's pid namespace (0 when the holder is outside it; then the pid the client
 *   wrote, its own view, is shown). The client touches its file every second: after it ended,
 *   the file's mtime is when it last ran, which is what its energy counts up to.
 *
 * Telemetry of a whole GPU, from its load (the utilisation shares of its work, at most 100;
 * work in a MIG instance counts by the instance's share of the GPU's memory slices, from its
 * id: 0 the whole GPU, 1-2 halves, 3-6 quarters, 7-14 eighths):
 *   utilisation  the profile's idle figure (0) plus the load; memory utilisation 45% of it;
 *                NOT_SUPPORTED with MIG enabled, as the driver says ("On MIG-enabled GPUs,
 *                querying device utilization rates is not currently supported")
 *   power        idle + (85% of the limit - idle) x load
 *   temperature  idle + 35 C x load
 *   clocks       SM at the idle clock without work, at the maximum with any (P0 boost);
 *                memory fixed (HBM), as on A100/H100
 *   energy       idle power since boot + the extra power of each piece of work over its life
 *                (mJ, monotonic: ended work is folded into the state's `energy` by writers)
 *   PCIe         throughput from the load; replays 0
 *   ECC          the single/double-bit ECC events injected (volatile since reset, aggregate);
 *                rows remapped for uncorrectable errors (Ampere and newer), pending a reset
 * MIG device handles answer memory and processes (their own); the rest NOT_SUPPORTED.
 */
#include "mock.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define CLIENTS_DIR "clients"
#define CLIENT_MAGIC "gpukit-nvml-client"
#define MOCK_MAX_CLIENTS 256
#define CLIENT_CACHE_NS 200000000ULL /* a scrape's many queries share one look at the clients */

typedef struct {
    char file[256];
    int alive;
    unsigned gpu, gi, ci, util, pid;
    int mps; /* a client of an MPS server (`mps SERVER_PID`), not a context of its own */
    unsigned long long bytes, start_ns, last_ns;
} mock_client;

static mock_client g_clients[MOCK_MAX_CLIENTS];
static unsigned g_nclients;
static unsigned long long g_clients_at;    /* CLOCK_MONOTONIC of the last scan, 0: none */
static char g_clients_dir[PATH_MAX + 16];  /* which directory that scan read */
static char g_folded[MOCK_MAX_CLIENTS][256]; /* ended clients folded into the state being written */
static unsigned g_nfolded;

static unsigned long long clock_ns(clockid_t id)
{
    struct timespec ts;
    clock_gettime(id, &ts);
    return (unsigned long long)ts.tv_sec * 1000000000ULL + (unsigned long long)ts.tv_nsec;
}

unsigned long long mock_now_ns(void) { return clock_ns(CLOCK_REALTIME); }

static unsigned long long boot_ns(void)
{
    if (g_state.boot_ns)
        return g_state.boot_ns;
    return mock_now_ns() - clock_ns(CLOCK_BOOTTIME); /* never booted by the lab: the host's */
}

static int gpu_of_minor(unsigned minor)
{
    for (unsigned i = 0; i < g_prof.ngpu; i++)
        if (g_prof.gpu[i].minor == minor)
            return (int)i;
    return -1;
}

/* "gpukit-nvml-client 1 minor M gi G|- ci C|- bytes B util U pid P start NS [mps SERVER_PID]"
 * `mps`: the process is a client of the MPS server SERVER_PID (gpu-work through the lab's
 * nvidia-cuda-mps-control); NVML lists it among the MPS clients, its server among the
 * processes. */
static int parse_client(const char *text, mock_client *c)
{
    char buf[512];
    snprintf(buf, sizeof buf, "%s", text);
    char *tok[32], *ts = NULL;
    int n = 0;
    for (char *t = strtok_r(buf, " \t\r\n", &ts); t && n < 32; t = strtok_r(NULL, " \t\r\n", &ts))
        tok[n++] = t;
    if (n < 2 || strcmp(tok[0], CLIENT_MAGIC) || strcmp(tok[1], "1"))
        return -1;
    unsigned minor = MOCK_NO_ID;
    c->gi = c->ci = MOCK_NO_ID;
    for (int i = 2; i + 1 < n; i += 2) {
        const char *k = tok[i], *v = tok[i + 1];
        unsigned long long x = strtoull(v, NULL, 10);
        if (!strcmp(k, "minor"))
            minor = (unsigned)x;
        else if (!strcmp(k, "gi"))
            c->gi = strcmp(v, "-") ? (unsigned)x : MOCK_NO_ID;
        else if (!strcmp(k, "ci"))
            c->ci = strcmp(v, "-") ? (unsigned)x : MOCK_NO_ID;
        else if (!strcmp(k, "bytes"))
            c->bytes = x;
        else if (!strcmp(k, "util"))
            c->util = x > 100 ? 100 : (unsigned)x;
        else if (!strcmp(k, "pid"))
            c->pid = (unsigned)x;
        else if (!strcmp(k, "start"))
            c->start_ns = x;
        else if (!strcmp(k, "mps"))
            c->mps = 1;
    }
    int gpu = minor == MOCK_NO_ID ? -1 : gpu_of_minor(minor);
    if (gpu < 0)
        return -1;
    c->gpu = (unsigned)gpu;
    return 0;
}

static void read_client(int dfd, const char *name)
{
    if (g_nclients >= MOCK_MAX_CLIENTS)
        return;
    int fd = openat(dfd, name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0)
        return;
    mock_client c;
    memset(&c, 0, sizeof c);
    char text[512];
    ssize_t len = read(fd, text, sizeof text - 1);
    struct stat st;
    struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = 0, .l_len = 0};
    if (len > 0 && fstat(fd, &st) == 0 && fcntl(fd, F_GETLK, &fl) == 0) {
        text[len] = 0;
        if (parse_client(text, &c) == 0) {
            snprintf(c.file, sizeof c.file, "%s", name);
            c.alive = fl.l_type != F_UNLCK;
            if (c.alive && fl.l_pid > 0)
                c.pid = (unsigned)fl.l_pid;
            c.last_ns = (unsigned long long)st.st_mtim.tv_sec * 1000000000ULL +
                        (unsigned long long)st.st_mtim.tv_nsec;
            if (c.last_ns < c.start_ns)
                c.last_ns = c.start_ns;
            g_clients[g_nclients++] = c;
        }
    }
    close(fd);
}

static void scan_clients(int force)
{
    char dir[PATH_MAX + 16];
    snprintf(dir, sizeof dir, "%s/%s", g_state_dir, CLIENTS_DIR);
    unsigned long long now = clock_ns(CLOCK_MONOTONIC);
    if (!force && g_clients_at && now - g_clients_at < CLIENT_CACHE_NS &&
        !strcmp(dir, g_clients_dir))
        return;
    g_nclients = 0;
    g_clients_at = now;
    snprintf(g_clients_dir, sizeof g_clients_dir, "%s", dir);
    DIR *d = opendir(dir);
    if (!d)
        return; /* no workload has run here */
    for (struct dirent *e; (e = readdir(d));)
        if (e->d_name[0] != '.')
            read_client(dirfd(d), e->d_name);
    closedir(d);
}

/* The instance a piece of work runs in exists now (MIG enabled, GI and CI present). */
static int instance_exists(const mock_gpu_state *gs, unsigned gi, unsigned ci)
{
    if (gi == MOCK_NO_ID)
        return gs->mig_current != NVML_DEVICE_MIG_ENABLE;
    if (gs->mig_current != NVML_DEVICE_MIG_ENABLE || gi >= MOCK_MAX_GI || !gs->gi[gi].used)
        return 0;
    return ci == MOCK_NO_ID || (ci < MOCK_MAX_CI && gs->gi[gi].ci[ci].used);
}

unsigned mock_work_of(unsigned gpu, mock_work *out, unsigned max)
{
    const mock_gpu_state *gs = &g_state.gpu[gpu];
    unsigned n = 0;
    for (unsigned i = 0; i < gs->nproc && n < max; i++) {
        const mock_proc *p = &gs->proc[i];
        out[n++] = (mock_work){p->pid, p->used_bytes, p->gi, p->ci, p->util, 0};
    }
    scan_clients(0);
    for (unsigned i = 0; i < g_nclients && n < max; i++) {
        const mock_client *c = &g_clients[i];
        if (c->alive && c->gpu == gpu && instance_exists(gs, c->gi, c->ci))
            out[n++] = (mock_work){c->pid, c->bytes, c->gi, c->ci, c->util, c->mps};
    }
    return n;
}

int mock_gpu_busy_index(unsigned gpu)
{
    mock_work w[MOCK_MAX_WORK];
    return gpu < g_prof.ngpu && mock_work_of(gpu, w, MOCK_MAX_WORK) > 0;
}

/* A piece of work's share of its GPU, in % of the whole GPU. */
static unsigned share_of(unsigned gi, unsigned util)
{
    if (gi == MOCK_NO_ID)
        return util;
    unsigned eighths = gi == 0 ? 8 : gi <= 2 ? 4 : gi <= 6 ? 2 : 1;
    return util * eighths / 8;
}

static unsigned gpu_load(unsigned gpu, unsigned *nwork)
{
    mock_work w[MOCK_MAX_WORK];
    unsigned n = mock_work_of(gpu, w, MOCK_MAX_WORK), sum = 0;
    for (unsigned i = 0; i < n; i++)
        sum += share_of(w[i].gi, w[i].util);
    if (nwork)
        *nwork = n;
    return sum > 100 ? 100 : sum;
}

static unsigned busy_extra_mw(const mock_gpu *p)
{
    unsigned busy = p->power_limit_mw / 100 * 85;
    return busy > p->power_usage_mw ? busy - p->power_usage_mw : 0;
}

static unsigned long long work_energy_mj(const mock_gpu *p, unsigned gi, unsigned util,
                                         unsigned long long from, unsigned long long to)
{
    if (to <= from)
        return 0;
    double mw = (double)busy_extra_mw(p) * share_of(gi, util) / 100.0;
    return (unsigned long long)(mw * (double)(to - from) / 1e9);
}

unsigned long long mock_proc_energy_mj(unsigned gpu, const mock_proc *pr, unsigned long long now)
{
    return work_energy_mj(&g_prof.gpu[gpu], pr->gi, pr->util, pr->since_ns, now);
}

void mock_fold_proc_energy(unsigned gpu, const mock_proc *pr)
{
    g_state.gpu[gpu].energy_mj += mock_proc_energy_mj(gpu, pr, mock_now_ns());
}

void mock_fold_dead_clients(void)
{
    g_nfolded = 0;
    scan_clients(1);
    for (unsigned i = 0; i < g_nclients; i++) {
        const mock_client *c = &g_clients[i];
        if (c->alive || g_nfolded >= MOCK_MAX_CLIENTS)
            continue;
        g_state.gpu[c->gpu].energy_mj +=
            work_energy_mj(&g_prof.gpu[c->gpu], c->gi, c->util, c->start_ns, c->last_ns);
        memcpy(g_folded[g_nfolded++], c->file, sizeof c->file);
    }
}

static void unlink_client(const char *name)
{
    char dir[PATH_MAX + 16];
    snprintf(dir, sizeof dir, "%s/%s", g_state_dir, CLIENTS_DIR);
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
        unlinkat(dfd, name, 0);
        close(dfd);
    }
}

void mock_unlink_folded_clients(void)
{
    for (unsigned i = 0; i < g_nfolded; i++)
        unlink_client(g_folded[i]);
    g_nfolded = 0;
    g_clients_at = 0;
}

void mock_clients_clear(void)
{
    /* A boot: the processes of before are gone, and so is what they used. */
    scan_clients(1);
    for (unsigned i = 0; i < g_nclients; i++)
        if (!g_clients[i].alive)
            unlink_client(g_clients[i].file);
    g_nfolded = 0;
    g_clients_at = 0;
}

static unsigned long long energy_mj(unsigned gpu)
{
    const mock_gpu *p = &g_prof.gpu[gpu];
    const mock_gpu_state *gs = &g_state.gpu[gpu];
    unsigned long long now = mock_now_ns(), boot = boot_ns();
    unsigned long long e = now > boot ? (unsigned long long)((double)p->power_usage_mw *
                                                             (double)(now - boot) / 1e9)
                                      : 0;
    e += gs->energy_mj;
    for (unsigned i = 0; i < gs->nproc; i++)
        e += mock_proc_energy_mj(gpu, &gs->proc[i], now);
    scan_clients(0);
    for (unsigned i = 0; i < g_nclients; i++) {
        const mock_client *c = &g_clients[i];
        if (c->gpu == gpu) /* ended ones too, until a writer folds them in */
            e += work_energy_mj(p, c->gi, c->util, c->start_ns, c->last_ns);
    }
    return e;
}

/* ---- clocks of the architecture when the profile names none ---- */
static void clocks_of(const mock_gpu *p, unsigned *sm_max, unsigned *sm_idle, unsigned *mem)
{
    unsigned a = 1410, i = 210, m = 1215; /* A100 */
    if (p->arch == NVML_DEVICE_ARCH_HOPPER) {
        a = 1980;
        i = 345;
        m = 2619;
    } else if (p->arch == NVML_DEVICE_ARCH_TURING) {
        a = 1590;
        i = 300;
        m = 5000;
    }
    *sm_max = p->sm_clock_max_mhz ? p->sm_clock_max_mhz : a;
    *sm_idle = p->sm_clock_idle_mhz ? p->sm_clock_idle_mhz : i;
    *mem = p->mem_clock_mhz ? p->mem_clock_mhz : m;
}

/* ---- NVML entry points ---- */
static nvmlReturn_t util_impl(nvmlDevice_t d, nvmlUtilization_t *u)
{
    if (!u)
        return NVML_ERROR_INVALID_ARGUMENT;
    devref r;
    nvmlReturn_t rc = dev_get(d, &r, 0);
    if (rc != NVML_SUCCESS)
        return rc;
    if (r.s->mig_current == NVML_DEVICE_MIG_ENABLE)
        return NVML_ERROR_NOT_SUPPORTED;
    unsigned load = gpu_load(r.gpu, NULL);
    unsigned g = r.p->util_gpu + load, m = r.p->util_mem + load * 45 / 100;
    u->gpu = g > 100 ? 100 : g;
    u->memory = m > 100 ? 100 : m;
    return NVML_SUCCESS;
}
EXPORT nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t *utilization)
{
    LOCKED(util_impl(device, utilization));
}

static nvmlReturn_t power_impl(nvmlDevice_t d, unsigned int *mw)
{
    if (!mw)
        return NVML_ERROR_INVALID_ARGUMENT;
    devref r;
    nvmlReturn_t rc = dev_get(d, &r, 0);
    if (rc == NVML_SUCCESS)
        *mw = r.p->power_usage_mw + busy_extra_mw(r.p) / 100 * gpu_load(r.gpu, NULL);
    return rc;
}
EXPORT nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t device, unsigned int *power)
{
    LOCKED(power_impl(device, power));
}

static nvmlReturn_t temp_impl(nvmlDevice_t d, nvmlTemperatureSensors_t sensor, unsigned int *temp)
{
    if (!temp || sensor != NVML_TEMPERATURE_GPU)
        return NVML_ERROR_INVALID_ARGUMENT;
    devref r;
    nvmlReturn_t rc = dev_get(d, &r, 0);
    if (rc == NVML_SUCCESS)
        *temp = r.p->temperature_c + 35 * gpu_load(r.gpu, NULL) / 100;
    return rc;
}
EXPORT nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t device, nvmlTemperatureSensors_t sensorType,
                                             unsigned int *temp)
{
    LOCKED(temp_impl(device, sensorType, temp));
}

static nvmlReturn_t energy_impl(nvmlDevice_t d, unsigned long long *mj)
{
    if (!mj)
        return NVML_ERROR_INVALID_ARGUMENT;
    devref r;
    nvmlReturn_t rc = dev_get(d, &r, 0);
    if (rc == NVML_SUCCESS)
        *mj = energy_mj(r.gpu);
    return rc;
}
EXPORT nvmlReturn_t nvmlDeviceGetTotalEnergyConsumption(nvmlDevice_t device, unsigned long long *energy)
{
    LOCKED(energy_impl(device, energy));
}

static nvmlReturn_t clock_impl(nvmlDevice_t d, nvmlClockType_t type, unsigned int *mhz, int max)
{
    if (!mhz || (unsigned)type >= NVML_CLOCK_COUNT)
        return NVML_ERROR_INVALID_ARGUMENT;
    devref r;
    nvmlReturn_t rc = dev_get(d, &r, 0);
    if (rc != NVML_SUCCESS)
        return rc;
    unsigned sm_max, sm_idle, mem, nwork = 0;
    clocks_of(r.p, &sm_max, &sm_idle, &mem);
    if (!max)
        gpu_load(r.gpu, &nwork);
    unsigned sm = (max || nwork) ? sm_max : sm_idle;
    switch (type) {
    case NVML_CLOCK_GRAPHICS:
    case NVML_CLOCK_SM: *mhz = sm; break;
    case NVML_CLOCK_MEM: *mhz = mem; break;
    case NVML_CLOCK_VIDEO: *mhz = sm * 9 / 10; break;
    default: return NVML_ERROR_INVALID_ARGUMENT;
    }
    return NVML_SUCCESS;
}
EXPORT nvmlReturn_t nvmlDeviceGetClockInfo(nvmlDevice_t device, nvmlClockType_t type, unsigned int *clock)
{
    LOCKED(clock_impl(device, type, clock, 0));
}
EXPORT nvmlReturn_t nvmlDeviceGetMaxClockInfo(nvmlDevice_t device, nvmlClockType_t type,
                                              unsigned int *clock)
{
    LOCKED(clock_impl(device, type, clock, 1));
}

static nvmlReturn_t pcie_tp_impl(nvmlDevice_t d, nvmlPcieUtilCounter_t counter, unsigned int *kbs)
{
    if (!kbs || (unsigned)counter >= NVML_PCIE_UTIL_COUNT)
        return NVML_ERROR_INVALID_ARGUMENT;
    devref r;
    nvmlReturn_t rc = dev_get(d, &r, 0);
    if (rc != NVML_SUCCESS)
        return rc;
    unsigned load = gpu_load(r.gpu, NULL);
    /* KB/s over the driver's 20 ms window: a few KB idle, host-to-device heavy when working */
    *kbs = counter == NVML_PCIE_UTIL_TX_BYTES ? 6 + 800 * load : 3 + 2500 * load;
    return NVML_SUCCESS;
}
EXPORT nvmlReturn_t nvmlDeviceGetPcieThroughput(nvmlDevice_t device, nvmlPcieUtilCounter_t counter,
                                                unsigned int *value)
{
    LOCKED(pcie_tp_impl(device, counter, value));
}

static nvmlReturn_t replay_impl(nvmlDevice_t d, unsigned int *value)
{
    if (!value)
        return NVML_ERROR_INVALID_ARGUMENT;
    devref r;
    nvmlReturn_t rc = dev_get(d, &r, 0);
    if (rc == NVML_SUCCESS)
        *value = 0; /* a healthy link does not replay */
    return rc;
}
EXPORT nvmlReturn_t nvmlDeviceGetPcieReplayCounter(nvmlDevice_t device, unsigned int *value)
{
    LOCKED(replay_impl(device, value));
}

static nvmlReturn_t ecc_count_impl(nvmlDevice_t d, nvmlMemoryErrorType_t type,
                                   nvmlEccCounterType_t counter, unsigned long long *count)
{
    if (!count || (unsigned)type >= NVML_MEMORY_ERROR_TYPE_COUNT ||
        (unsigned)counter >= NVML_ECC_COUNTER_TYPE_COUNT)
        return NVML_ERROR_INVALID_ARGUMENT;
    devref r;
    nvmlReturn_t rc = dev_get(d, &r, 0);
    if (rc != NVML_SUCCESS)
        return rc;
    const mock_gpu_state *gs = r.s;
    int vol = counter == NVML_VOLATILE_ECC;
    if (type == NVML_MEMORY_ERROR_TYPE_CORRECTED)
        *count = vol ? gs->sbe_vol : gs->sbe_agg;
    else
        *count = vol ? gs->dbe_vol : gs->dbe_agg;
    return NVML_SUCCESS;
}
EXPORT nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t device, nvmlMemoryErrorType_t errorType,
                                                nvmlEccCounterType_t counterType,
                                                unsigned long long *eccCounts)
{
    LOCKED(ecc_count_impl(device, errorType, counterType, eccCounts));
}

static nvmlReturn_t remap_impl(nvmlDevice_t d, unsigned int *corr, unsigned int *unc,
                               unsigned int *pending, unsigned int *failed)
{
    if (!corr || !unc || !pending || !failed)
        return NVML_ERROR_INVALID_ARGUMENT;
    devref r;
    nvmlReturn_t rc = dev_get(d, &r, 0);
    if (rc != NVML_SUCCESS)
        return rc;
    if (r.p->arch < NVML_DEVICE_ARCH_AMPERE)
        return NVML_ERROR_NOT_SUPPORTED; /* row remapping came with Ampere */
    *corr = 0;
    *unc = (unsigned)(r.s->dbe_agg > 512 ? 512 : r.s->dbe_agg); /* a bank has 512 spare rows */
    *pending = r.s->remap_pending;
    *failed = r.s->dbe_agg > 512;
    return NVML_SUCCESS;
}
EXPORT nvmlReturn_t nvmlDeviceGetRemappedRows(nvmlDevice_t device, unsigned int *corrRows,
                                              unsigned int *uncRows, unsigned int *isPending,
                                              unsigned int *failureOccurred)
{
    LOCKED(remap_impl(device, corrRows, uncRows, isPending, failureOccurred));
}
