/*
 * gpukit mock NVML: lab control entry points (not NVML).
 *
 * These are what `python -m gpukit.lab.nvml` calls through ctypes, so the state format has one
 * owner: this library. Each works whether or not nvmlInit was called in the process (without it,
 * the profile and state dir come from gpukitMockConfigure, the environment or the defaults).
 */
#include "mock.h"

#include <stdlib.h>
#include <string.h>

#define CTL(expr)                                                                                  \
    do {                                                                                           \
        pthread_mutex_lock(&g_mu);                                                                 \
        nvmlReturn_t r_ = g_refcount ? NVML_SUCCESS : mock_load_config();                          \
        if (r_ == NVML_SUCCESS)                                                                    \
            r_ = (expr);                                                                           \
        pthread_mutex_unlock(&g_mu);                                                               \
        return r_;                                                                                 \
    } while (0)

/* The state locked for a change, when the caller's arguments are `valid`. */
static nvmlReturn_t lock_valid(int valid, int *fd)
{
    return valid ? state_lock(fd) : NVML_ERROR_INVALID_ARGUMENT;
}

static nvmlReturn_t inject(unsigned gpu, unsigned long long type, unsigned long long data,
                           unsigned gi, unsigned ci)
{
    int fd;
    nvmlReturn_t rc = lock_valid(!(gpu >= g_prof.ngpu || !type || (type & ~mock_supported_events())), &fd);
    if (rc != NVML_SUCCESS)
        return rc;
    rc = mock_emit("E", gpu, type, data, gi, ci);
    mock_gpu_state *gs = &g_state.gpu[gpu];
    if (rc != NVML_SUCCESS || !(type & (nvmlEventTypeSingleBitEccError | nvmlEventTypeDoubleBitEccError))) {
        state_unlock(fd);
        return rc;
    }
    /* The driver counts ECC errors (nvmlDeviceGetTotalEccErrors); an uncorrectable one remaps
     * a row, which takes effect at the next reset (nvmlDeviceGetRemappedRows: pending). */
    if (type & nvmlEventTypeSingleBitEccError) {
        gs->sbe_vol++;
        gs->sbe_agg++;
    }
    if (type & nvmlEventTypeDoubleBitEccError) {
        gs->dbe_vol++;
        gs->dbe_agg++;
        gs->remap_pending = 1;
    }
    return state_commit(fd);
}

EXPORT nvmlReturn_t gpukitMockInjectEvent(unsigned int gpu, unsigned long long eventType,
                                          unsigned long long eventData, unsigned int gpuInstanceId,
                                          unsigned int computeInstanceId)
{
    CTL(inject(gpu, eventType, eventData, gpuInstanceId, computeInstanceId));
}

EXPORT nvmlReturn_t gpukitMockInjectXid(unsigned int gpu, unsigned long long xid,
                                        unsigned int gpuInstanceId, unsigned int computeInstanceId)
{
    CTL(inject(gpu, nvmlEventTypeXidCriticalError, xid, gpuInstanceId, computeInstanceId));
}

static nvmlReturn_t set_lost(unsigned gpu, int lost)
{
    int fd;
    nvmlReturn_t rc = lock_valid(gpu < g_prof.ngpu, &fd);
    if (rc != NVML_SUCCESS)
        return rc;
    int was = g_state.gpu[gpu].lost;
    g_state.gpu[gpu].lost = lost != 0;
    if (lost && !was && (rc = mock_emit("L", gpu, 0, 0, 0, 0)) != NVML_SUCCESS) {
        state_unlock(fd);
        return rc;
    }
    return state_commit(fd);
}

EXPORT nvmlReturn_t gpukitMockSetLost(unsigned int gpu, int lost) { CTL(set_lost(gpu, lost)); }

/* A misbehaving driver: event sets watching this GPU stop blocking in nvmlEventSetWait (mode
 * MOCK_EVENTS_TIMEOUT: NVML_ERROR_TIMEOUT at once; MOCK_EVENTS_SPURIOUS: at once with a PState
 * event): the early returns that once made the plugin's health loop spin. Real events are still
 * delivered first. */
static nvmlReturn_t set_event_fault(unsigned gpu, unsigned mode)
{
    int fd;
    nvmlReturn_t rc = lock_valid(!(gpu >= g_prof.ngpu || mode >= MOCK_EVENTS_MODES), &fd);
    if (rc != NVML_SUCCESS)
        return rc;
    g_state.gpu[gpu].events = mode;
    return state_commit(fd);
}

EXPORT nvmlReturn_t gpukitMockSetEventFault(unsigned int gpu, unsigned int mode)
{
    CTL(set_event_fault(gpu, mode));
}

static nvmlReturn_t set_process(unsigned gpu, unsigned pid, unsigned long long bytes, unsigned gi,
                                unsigned ci, const char *name, unsigned util)
{
    int fd;
    nvmlReturn_t rc = lock_valid(!(gpu >= g_prof.ngpu || pid == 0 || (gi == MOCK_NO_ID && ci != MOCK_NO_ID) || util > 100), &fd);
    if (rc != NVML_SUCCESS)
        return rc;
    mock_gpu_state *gs = &g_state.gpu[gpu];
    const mock_gpu *p = &g_prof.gpu[gpu];
    unsigned long long limit = p->memory_mib << 20;
    if (gs->lost)
        rc = NVML_ERROR_GPU_IS_LOST;
    else if (gi != MOCK_NO_ID) {
        if (gs->mig_current != NVML_DEVICE_MIG_ENABLE || gi >= MOCK_MAX_GI || !gs->gi[gi].used ||
            (ci != MOCK_NO_ID && (ci >= MOCK_MAX_CI || !gs->gi[gi].ci[ci].used)))
            rc = NVML_ERROR_NOT_FOUND;
        else {
            const mock_gi_profile *gp = mig_gi_profile(p->mig, gs->gi[gi].profile_id);
            limit = gp ? gp->memory_mb << 20 : limit;
        }
    }
    if (rc == NVML_SUCCESS && bytes > limit)
        rc = NVML_ERROR_INSUFFICIENT_RESOURCES;
    mock_proc *slot = NULL;
    for (unsigned i = 0; rc == NVML_SUCCESS && i < gs->nproc && !slot; i++)
        if (gs->proc[i].pid == pid)
            slot = &gs->proc[i];
    if (rc == NVML_SUCCESS && !slot) {
        if (gs->nproc >= MOCK_MAX_PROCS)
            rc = NVML_ERROR_INSUFFICIENT_SIZE;
        else
            slot = &gs->proc[gs->nproc++];
    }
    if (rc != NVML_SUCCESS) {
        state_unlock(fd);
        return rc;
    }
    if (slot->pid == pid)
        mock_fold_proc_energy(gpu, slot); /* its work so far stays counted; it restarts now */
    memset(slot, 0, sizeof *slot);
    slot->pid = pid;
    slot->util = util;
    slot->since_ns = mock_now_ns();
    slot->used_bytes = bytes;
    slot->gi = gi;
    slot->ci = ci;
    for (size_t i = 0; name && name[i] && i < sizeof slot->name - 1; i++)
        slot->name[i] = (name[i] <= ' ') ? '_' : name[i]; /* one token in the state file */
    return state_commit(fd);
}

EXPORT nvmlReturn_t gpukitMockSetProcess(unsigned int gpu, unsigned int pid,
                                         unsigned long long usedBytes, unsigned int gpuInstanceId,
                                         unsigned int computeInstanceId, const char *name)
{
    CTL(set_process(gpu, pid, usedBytes, gpuInstanceId, computeInstanceId, name, 100));
}

/* The same with how busy it keeps its GPU (or MIG instance), in %. */
EXPORT nvmlReturn_t gpukitMockSetProcessWork(unsigned int gpu, unsigned int pid,
                                             unsigned long long usedBytes,
                                             unsigned int gpuInstanceId,
                                             unsigned int computeInstanceId, const char *name,
                                             unsigned int utilization)
{
    CTL(set_process(gpu, pid, usedBytes, gpuInstanceId, computeInstanceId, name, utilization));
}

static nvmlReturn_t clear_processes(unsigned gpu, unsigned pid)
{
    int fd;
    nvmlReturn_t rc = lock_valid(gpu == MOCK_NO_ID || gpu < g_prof.ngpu, &fd);
    if (rc != NVML_SUCCESS)
        return rc;
    unsigned removed = 0;
    for (unsigned g = 0; g < g_prof.ngpu; g++) {
        if (gpu != MOCK_NO_ID && g != gpu)
            continue;
        mock_gpu_state *gs = &g_state.gpu[g];
        unsigned k = 0;
        for (unsigned i = 0; i < gs->nproc; i++) {
            if (pid == 0 || gs->proc[i].pid == pid) {
                mock_fold_proc_energy(g, &gs->proc[i]);
                removed++;
                continue;
            }
            gs->proc[k++] = gs->proc[i];
        }
        gs->nproc = k;
    }
    if (pid != 0 && removed == 0) {
        state_unlock(fd);
        return NVML_ERROR_NOT_FOUND;
    }
    return state_commit(fd);
}

EXPORT nvmlReturn_t gpukitMockClearProcesses(unsigned int gpu, unsigned int pid)
{
    CTL(clear_processes(gpu, pid));
}

static nvmlReturn_t reset_gpu(unsigned gpu)
{
    int fd;
    nvmlReturn_t rc = lock_valid(gpu < g_prof.ngpu, &fd);
    if (rc != NVML_SUCCESS)
        return rc;
    mock_gpu_state *gs = &g_state.gpu[gpu];
    if (gs->lost)
        rc = NVML_ERROR_GPU_IS_LOST;
    else if (mock_gpu_busy(gs))
        rc = NVML_ERROR_IN_USE; /* like nvidia-smi -r: processes must go first */
    if (rc != NVML_SUCCESS) {
        state_unlock(fd);
        return rc;
    }
    mock_apply_reset(gpu);
    gs->sbe_vol = gs->dbe_vol = 0; /* volatile ECC counts end with the reset ... */
    gs->remap_pending = 0;          /* ... which applies the pending row remaps */
    return state_commit(fd);
}

EXPORT nvmlReturn_t gpukitMockResetGpu(unsigned int gpu) { CTL(reset_gpu(gpu)); }

static nvmlReturn_t boot(void)
{
    int fd;
    nvmlReturn_t rc = state_lock(&fd);
    if (rc != NVML_SUCCESS)
        return rc;
    for (unsigned g = 0; g < g_prof.ngpu; g++) {
        mock_gpu_state *gs = &g_state.gpu[g];
        gs->nproc = 0;
        gs->lost = 0;
        gs->energy_mj = gs->sbe_vol = gs->dbe_vol = 0; /* energy counts from the driver's load */
        gs->remap_pending = 0;
        gs->events = MOCK_EVENTS_NORMAL;
        gs->compute_mode = NVML_COMPUTEMODE_DEFAULT; /* not kept across a driver load */
        mock_apply_reset(g);
    }
    events_truncate(); /* nobody from before the boot is waiting */
    mock_clients_clear();
    g_state.boot_ns = mock_now_ns();
    caps_render_static(); /* the driver loads: its /proc/driver files (reported on failure) */
    return state_commit(fd);
}

EXPORT nvmlReturn_t gpukitMockBoot(void) { CTL(boot()); }

static nvmlReturn_t status(char *buf, unsigned int *size)
{
    if (!size)
        return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t rc = state_refresh();
    if (rc != NVML_SUCCESS)
        return rc;
    size_t len = 0;
    char *json = mock_status_json(&len);
    if (!json)
        return NVML_ERROR_MEMORY;
    if (!buf || *size < len + 1) {
        *size = (unsigned)len + 1;
        free(json);
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    memcpy(buf, json, len + 1);
    *size = (unsigned)len + 1;
    free(json);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t gpukitMockStatusJson(char *buf, unsigned int *size) { CTL(status(buf, size)); }
