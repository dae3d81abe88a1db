/*
 * gpukit mock NVML: device handles and device queries.
 */
#include "mock.h"

#include <stdio.h>
#include <string.h>
#include <strings.h>

struct nvmlDevice_st g_dev_handles[MOCK_MAX_GPUS];
struct nvmlDevice_st g_mig_handles[MOCK_MAX_GPUS][MOCK_MAX_GI][MOCK_MAX_CI];
struct nvmlGpuInstance_st g_gi_handles[MOCK_MAX_GPUS][MOCK_MAX_GI];
struct nvmlComputeInstance_st g_ci_handles[MOCK_MAX_GPUS][MOCK_MAX_GI][MOCK_MAX_CI];

void handles_init(void)
{
    for (unsigned i = 0; i < MOCK_MAX_GPUS; i++) {
        g_dev_handles[i] = (struct nvmlDevice_st){HANDLE_GPU, i, 0, 0};
        for (unsigned g = 0; g < MOCK_MAX_GI; g++) {
            g_gi_handles[i][g] = (struct nvmlGpuInstance_st){i, g};
            for (unsigned c = 0; c < MOCK_MAX_CI; c++) {
                g_mig_handles[i][g][c] = (struct nvmlDevice_st){HANDLE_MIG, i, g, c};
                g_ci_handles[i][g][c] = (struct nvmlComputeInstance_st){i, g, c};
            }
        }
    }
}

/* A handle is valid only if it points at one of our handle slots. */
static int slot(const void *p, const void *base, size_t total, size_t elem)
{
    uintptr_t a = (uintptr_t)p, b = (uintptr_t)base;
    return a >= b && a < b + total && (a - b) % elem == 0;
}

nvmlReturn_t dev_get(nvmlDevice_t d, devref *out, int flags)
{
    if (!d)
        return NVML_ERROR_INVALID_ARGUMENT;
    memset(out, 0, sizeof *out);
    if (slot(d, g_dev_handles, sizeof g_dev_handles, sizeof g_dev_handles[0])) {
        out->gpu = d->gpu;
    } else if (slot(d, g_mig_handles, sizeof g_mig_handles, sizeof(struct nvmlDevice_st))) {
        out->gpu = d->gpu;
        out->mig = 1;
        out->gi = d->gi;
        out->ci = d->ci;
    } else {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    if (out->gpu >= g_prof.ngpu)
        return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t rc = state_refresh();
    if (rc != NVML_SUCCESS)
        return rc;
    out->p = &g_prof.gpu[out->gpu];
    out->s = &g_state.gpu[out->gpu];
    if (out->s->lost && !(flags & DEV_ALLOW_LOST))
        return NVML_ERROR_GPU_IS_LOST;
    if (out->mig) {
        if (!(flags & DEV_ALLOW_MIG))
            return NVML_ERROR_NOT_SUPPORTED;
        if (out->s->mig_current != NVML_DEVICE_MIG_ENABLE || !out->s->gi[out->gi].used ||
            !out->s->gi[out->gi].ci[out->ci].used)
            return NVML_ERROR_INVALID_ARGUMENT; /* the compute instance is gone */
    }
    return NVML_SUCCESS;
}

/* The GPU- and compute-instance profiles behind a MIG device handle. */
static void mig_profiles_of(const devref *r, const mock_gi_profile **gp, const mock_ci_profile **cp)
{
    const mock_gi_state *gi = &r->s->gi[r->gi];
    *gp = mig_gi_profile(r->p->mig, gi->profile_id);
    *cp = mig_ci_profile(*gp, gi->ci[r->ci].profile_id);
}

/* ---- count and handles ---- */
static nvmlReturn_t count_impl(unsigned int *n)
{
    if (!n)
        return NVML_ERROR_INVALID_ARGUMENT;
    *n = g_prof.ngpu;
    return NVML_SUCCESS;
}
EXPORT nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *deviceCount) { LOCKED(count_impl(deviceCount)); }
EXPORT nvmlReturn_t nvmlDeviceGetCount(unsigned int *deviceCount) { LOCKED(count_impl(deviceCount)); }

static nvmlReturn_t by_index(unsigned int index, nvmlDevice_t *device)
{
    if (!device || index >= g_prof.ngpu)
        return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t rc = state_refresh();
    if (rc != NVML_SUCCESS)
        return rc;
    if (g_state.gpu[index].lost)
        return NVML_ERROR_GPU_IS_LOST;
    *device = &g_dev_handles[index];
    return NVML_SUCCESS;
}
EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device)
{
    LOCKED(by_index(index, device));
}
EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t *device)
{
    LOCKED(by_index(index, device));
}

static nvmlReturn_t by_uuid(const char *uuid, nvmlDevice_t *device)
{
    if (!uuid || !device)
        return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t rc = state_refresh();
    if (rc != NVML_SUCCESS)
        return rc;
    for (unsigned i = 0; i < g_prof.ngpu; i++) {
        const mock_gpu_state *gs = &g_state.gpu[i];
        if (!strcasecmp(uuid, g_prof.gpu[i].uuid)) {
            if (gs->lost)
                return NVML_ERROR_GPU_IS_LOST;
            *device = &g_dev_handles[i];
            return NVML_SUCCESS;
        }
        if (gs->mig_current != NVML_DEVICE_MIG_ENABLE)
            continue;
        for (unsigned g = 0; g < MOCK_MAX_GI; g++)
            for (unsigned c = 0; gs->gi[g].used && c < MOCK_MAX_CI; c++)
                if (gs->gi[g].ci[c].used && !strcasecmp(uuid, gs->gi[g].ci[c].uuid)) {
                    if (gs->lost)
                        return NVML_ERROR_GPU_IS_LOST;
                    *device = &g_mig_handles[i][g][c];
                    return NVML_SUCCESS;
                }
    }
    return NVML_ERROR_NOT_FOUND;
}
EXPORT nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device)
{
    LOCKED(by_uuid(uuid, device));
}

static nvmlReturn_t by_serial(const char *serial, nvmlDevice_t *device)
{
    if (!serial || !device)
        return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t rc = state_refresh();
    if (rc != NVML_SUCCESS)
        return rc;
    for (unsigned i = 0; i < g_prof.ngpu; i++)
        if (!strcmp(serial, g_prof.gpu[i].serial)) {
            if (g_state.gpu[i].lost)
                return NVML_ERROR_GPU_IS_LOST;
            *device = &g_dev_handles[i];
            return NVML_SUCCESS;
        }
    return NVML_ERROR_NOT_FOUND;
}
EXPORT nvmlReturn_t nvmlDeviceGetHandleBySerial(const char *serial, nvmlDevice_t *device)
{
    LOCKED(by_serial(serial, device));
}

static nvmlReturn_t by_pci(const char *bus_id, nvmlDevice_t *device)
{
    if (!bus_id || !device)
        return NVML_ERROR_INVALID_ARGUMENT;
    unsigned dom = 0, bus, dev, fn = 0;
    if (sscanf(bus_id, "%x:%x:%x.%x", &dom, &bus, &dev, &fn) < 3) {
        dom = 0;
        if (sscanf(bus_id, "%x:%x.%x", &bus, &dev, &fn) < 2)
            return NVML_ERROR_INVALID_ARGUMENT;
    }
    nvmlReturn_t rc = state_refresh();
    if (rc != NVML_SUCCESS)
        return rc;
    for (unsigned i = 0; i < g_prof.ngpu; i++) {
        const mock_gpu *g = &g_prof.gpu[i];
        if (g->domain == dom && g->bus == bus && g->device == dev && fn == 0) {
            if (g_state.gpu[i].lost)
                return NVML_ERROR_GPU_IS_LOST;
            *device = &g_dev_handles[i];
            return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_NOT_FOUND;
}
EXPORT nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char *pciBusId, nvmlDevice_t *device)
{
    LOCKED(by_pci(pciBusId, device));
}
EXPORT nvmlReturn_t nvmlDeviceGetHandleByPciBusId(const char *pciBusId, nvmlDevice_t *device)
{
    LOCKED(by_pci(pciBusId, device));
}

/* ---- identity ---- */
static nvmlReturn_t name_impl(nvmlDevice_t d, char *name, unsigned int length)
{
    devref r;
    nvmlReturn_t rc = dev_get(d, &r, DEV_ALLOW_MIG);
    if (rc != NVML_SUCCESS)
        return rc;
    if (!r.mig)
        return copy_str(name, length, r.p->name);
    const mock_gi_profile *gp;
    const mock_ci_profile *cp;
    mig_profiles_of(&r, &gp, &cp);
    char buf[NVML_DEVICE_NAME_V2_BUFFER_SIZE * 2];
    if (cp && gp && cp->slices < gp->compute_slices)
        snprintf(buf, sizeof buf, "%s MIG %uc.%s", r.p->name, cp->slices, gp->name);
    else
        snprintf(buf, sizeof buf, "%s MIG %s", r.p->name, gp ? gp->name : "?");
    return copy_str(name, length, buf);
}
EXPORT nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length)
{
    LOCKED(name_impl(device, name, length));
}

static nvmlReturn_t uuid_impl(nvmlDevice_t d, char *uuid, unsigned int length)
{
    devref r;
    nvmlReturn_t rc = dev_get(d, &r, DEV_ALLOW_MIG);
    if (rc != NVML_SUCCESS)
        return rc;
    return copy_str(uuid, length, r.mig ? r.s->gi[r.gi].ci[r.ci].uuid : r.p->uuid);
}
EXPORT nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length)
{
    LOCKED(uuid_impl(device, uuid, length));
}

static nvmlReturn_t serial_impl(nvmlDevice_t d, char *serial, unsigned int length)
{
    devref r;
    nvmlReturn_t rc = dev_get(d, &r, 0);
    return rc != NVML_SUCCESS ? rc : copy_str(serial, length, r.p->serial);
}
EXPORT nvmlReturn_t nvmlDeviceGetSerial(nvmlDevice_t device, char *serial, unsigned int length)
{
    LOCKED(serial_impl(device, serial, length));
}

static nvmlReturn_t vbios_impl(nvmlDevice_t d, char *v, unsigned int length)
{
    devref r;
    nvmlReturn_t rc = dev_get(d, &r, 0);
    return rc != NVML_SUCCESS ? rc : copy_str(v, length, r.p->vbios);
}
EXPORT nvmlReturn_t nvmlDeviceGetVbiosVersion(nvmlDevice_t device, char *version, unsigned int length)
{
    LOCKED(vbios_impl(device, version, length));
}

static nvmlReturn_t part_impl(nvmlDevice_t d, char *v, unsigned int length)
{
    devref r;
    nvmlReturn_t rc = dev_get(d, &r, 0);
    if (rc != NVML_SUCCESS)
        return rc;
    return r.p->part_number[0] ? copy_str(v, length, r.p->part_number) : NVML_ERROR_NOT_SUPPORTED;
}
EXPORT nvmlReturn_t nvmlDeviceGetBoardPartNumber(nvmlDevice_t device, char *partNumber,
                                                 unsigned int length)
{
    LOCKED(part_impl(device, partNumber, length));
}

/* One helper for the many "unsigned property of a full GPU" queries. */
enum prop {
    P_INDEX,
    P_MINOR,
    P_BRAND,
    P_ARCH,
    P_NUMA,
    P_POWER_LIMIT,
    P_PERSISTENCE,
    P_PSTATE,
    P_COMPUTE_MODE,
    P_DISPLAY,
    P_PCIE_GEN,
    P_PCIE_WIDTH,
};

static nvmlReturn_t prop_impl(nvmlDevice_t d, enum prop which, unsigned *out)
{
    if (!out)
        return NVML_ERROR_INVALID_ARGUMENT;
    devref r;
    int allow = (which == P_ARCH) ? DEV_ALLOW_MIG : 0;
    nvmlReturn_t rc = dev_get(d, &r, allow);
    if (rc != NVML_SUCCESS)
        return rc;
    switch (which) {
    case P_INDEX: *out = r.gpu; break;
    case P_MINOR: *out = r.p->minor; break;
    case P_BRAND: *out = r.p->brand; break;
    case P_ARCH: *out = r.p->arch; break;
    case P_NUMA:
        if (r.p->numa_node < 0)
            return NVML_ERROR_NOT_SUPPORTED;
        *out = (unsigned)r.p->numa_node;
        break;
    case P_POWER_LIMIT: *out = r.p->power_limit_mw; break;
    case P_PERSISTENCE: *out = r.p->persistence ? NVML_FEATURE_ENABLED : NVML_FEATURE_DISABLED; break;
    case P_PSTATE: *out = NVML_PSTATE_0; break;
    case P_COMPUTE_MODE: *out = g_state.gpu[r.gpu].compute_mode; break;
    case P_DISPLAY: *out = NVML_FEATURE_DISABLED; break;
    case P_PCIE_GEN: *out = r.p->pcie_gen; break;
    case P_PCIE_WIDTH: *out = r.p->pcie_width; break;
    }
    return NVML_SUCCESS;
}

#define PROP_API(fn, which, type)                                                                  \
    EXPORT nvmlReturn_t fn(nvmlDevice_t device, type *out)                                         \
    {                                                                                              \
        _Static_assert(sizeof(type) == sizeof(unsigned), "enum size");                             \
        LOCKED(prop_impl(device, which, (unsigned *)out));                                         \
    }

PROP_API(nvmlDeviceGetIndex, P_INDEX, unsigned int)
PROP_API(nvmlDeviceGetMinorNumber, P_MINOR, unsigned int)
PROP_API(nvmlDeviceGetBrand, P_BRAND, nvmlBrandType_t)
PROP_API(nvmlDeviceGetArchitecture, P_ARCH, nvmlDeviceArchitecture_t)
PROP_API(nvmlDeviceGetNumaNodeId, P_NUMA, unsigned int)
PROP_API(nvmlDeviceGetPowerManagementLimit, P_POWER_LIMIT, unsigned int)
PROP_API(nvmlDeviceGetEnforcedPowerLimit, P_POWER_LIMIT, unsigned int)
PROP_API(nvmlDeviceGetPersistenceMode, P_PERSISTENCE, nvmlEnableState_t)
PROP_API(nvmlDeviceGetPerformanceState, P_PSTATE, nvmlPstates_t)
PROP_API(nvmlDeviceGetComputeMode, P_COMPUTE_MODE, nvmlComputeMode_t)

/* The compute mode lives in the node's state file, as MIG mode does: the agent that sets it,
 * nvidia-smi and the workload that is refused by it are separate processes. EXCLUSIVE_THREAD (1)
 * was removed from the driver long ago; NVML answers it NOT_SUPPORTED. */
static nvmlReturn_t set_compute_mode(nvmlDevice_t d, nvmlComputeMode_t mode)
{
    if ((unsigned)mode > NVML_COMPUTEMODE_EXCLUSIVE_PROCESS)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (mode == NVML_COMPUTEMODE_EXCLUSIVE_THREAD)
        return NVML_ERROR_NOT_SUPPORTED;
    devref r;
    nvmlReturn_t rc = dev_get(d, &r, 0);
    if (rc != NVML_SUCCESS)
        return rc;
    int fd;
    if ((rc = state_lock(&fd)) != NVML_SUCCESS)
        return rc;
    if (g_state.gpu[r.gpu].lost) {
        state_unlock(fd);
        return NVML_ERROR_GPU_IS_LOST;
    }
    g_state.gpu[r.gpu].compute_mode = (unsigned)mode;
    return state_commit(fd);
}
EXPORT nvmlReturn_t nvmlDeviceSetComputeMode(nvmlDevice_t device, nvmlComputeMode_t mode)
{
    LOCKED(set_compute_mode(device, mode));
}
PROP_API(nvmlDeviceGetDisplayMode, P_DISPLAY, nvmlEnableState_t)
PROP_API(nvmlDeviceGetDisplayActive, P_DISPLAY, nvmlEnableState_t)
PROP_API(nvmlDeviceGetCurrPcieLinkGeneration, P_PCIE_GEN, unsigned int)
PROP_API(nvmlDeviceGetMaxPcieLinkGeneration, P_PCIE_GEN, unsigned int)
PROP_API(nvmlDeviceGetCurrPcieLinkWidth, P_PCIE_WIDTH, unsigned int)
PROP_API(nvmlDeviceGetMaxPcieLinkWidth, P_PCIE_WIDTH, unsigned int)

static nvmlReturn_t ecc_impl(nvmlDevice_t d, nvmlEnableState_t *cur, nvmlEnableState_t *pend)
{
    if (!cur || !pend)
        return NVML_ERROR_INVALID_ARGUMENT;
    devref r;
    nvmlReturn_t rc = dev_get(d, &r, 0);
    if (rc == NVML_SUCCESS)
        *cur = *pend = NVML_FEATURE_ENABLED;
    return rc;
}
EXPORT nvmlReturn_t nvmlDeviceGetEccMode(nvmlDevice_t device, nvmlEnableState_t *current,
                                         nvmlEnableState_t *pending)
{
    LOCKED(ecc_impl(device, current, pending));
}

static nvmlReturn_t cc_impl(nvmlDevice_t d, int *major, int *minor)
{
    if (!major || !minor)
        return NVML_ERROR_INVALID_ARGUMENT;
    devref r;
    nvmlReturn_t rc = dev_get(d, &r, DEV_ALLOW_MIG);
    if (rc != NVML_SUCCESS)
        return rc;
    *major = (int)r.p->cc_major;
    *minor = (int)r.p->cc_minor;
    return NVML_SUCCESS;
}
EXPORT nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t device, int *major, int *minor)
{
    LOCKED(cc_impl(device, major, minor));
}

/* ---- memory ---- */
/* Memory the work on this GPU (or MIG device: its instance's) uses (telemetry.c). */
static int work_on(const devref *r, const mock_work *w)
{
    return !r->mig || (w->gi == r->gi && (w->ci == r->ci || w->ci == MOCK_NO_ID));
}

static unsigned long long procs_bytes(const devref *r)
{
    mock_work w[MOCK_MAX_WORK];
    unsigned n = mock_work_of(r->gpu, w, MOCK_MAX_WORK);
    unsigned long long sum = 0;
    for (unsigned i = 0; i < n; i++)
        if (work_on(r, &w[i]))
            sum += w[i].used_bytes;
    return sum;
}

static nvmlReturn_t memory_impl(nvmlDevice_t d, unsigned long long *total,
                                unsigned long long *reserved, unsigned long long *used)
{
    devref r;
    nvmlReturn_t rc = dev_get(d, &r, DEV_ALLOW_MIG);
    if (rc != NVML_SUCCESS)
        return rc;
    if (r.mig) {
        const mock_gi_profile *gp;
        const mock_ci_profile *cp;
        mig_profiles_of(&r, &gp, &cp);
        *total = (gp ? gp->memory_mb : 0) << 20;
        *reserved = 0;
    } else {
        *total = r.p->memory_mib << 20;
        *reserved = r.p->memory_reserved_mib << 20;
    }
    *used = procs_bytes(&r);
    if (*used + *reserved > *total)
        *used = *total - *reserved;
    return NVML_SUCCESS;
}

static nvmlReturn_t mem_v1(nvmlDevice_t d, nvmlMemory_t *m)
{
    if (!m)
        return NVML_ERROR_INVALID_ARGUMENT;
    unsigned long long total, reserved, used;
    nvmlReturn_t rc = memory_impl(d, &total, &reserved, &used);
    if (rc != NVML_SUCCESS)
        return rc;
    m->total = total;
    m->used = used + reserved; /* v1 counts reserved memory as used */
    m->free = total - m->used;
    return NVML_SUCCESS;
}
EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory)
{
    LOCKED(mem_v1(device, memory));
}

static nvmlReturn_t mem_v2(nvmlDevice_t d, nvmlMemory_v2_t *m)
{
    if (!m)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (m->version != nvmlMemory_v2)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    unsigned long long total, reserved, used;
    nvmlReturn_t rc = memory_impl(d, &total, &reserved, &used);
    if (rc != NVML_SUCCESS)
        return rc;
    m->total = total;
    m->reserved = reserved;
    m->used = used;
    m->free = total - reserved - used;
    return NVML_SUCCESS;
}
EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory)
{
    LOCKED(mem_v2(device, memory));
}

/* ---- PCI ---- */
static void fill_pci(const mock_gpu *g, nvmlPciInfo_t *pci)
{
    memset(pci, 0, sizeof *pci);
    snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, "%04X:%02X:%02X.0", g->domain & 0xffff,
             g->bus, g->device);
    snprintf(pci->busId, sizeof pci->busId, "%s", g->pci_bus_id);
    pci->domain = g->domain;
    pci->bus = g->bus;
    pci->device = g->device;
    pci->pciDeviceId = g->pci_device_id;
    pci->pciSubSystemId = g->pci_subsystem_id;
}

static nvmlReturn_t pci_impl(nvmlDevice_t d, nvmlPciInfo_t *pci)
{
    if (!pci)
        return NVML_ERROR_INVALID_ARGUMENT;
    devref r;
    nvmlReturn_t rc = dev_get(d, &r, 0);
    if (rc == NVML_SUCCESS)
        fill_pci(r.p, pci);
    return rc;
}
EXPORT nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t *pci) { LOCKED(pci_impl(device, pci)); }
EXPORT nvmlReturn_t nvmlDeviceGetPciInfo_v2(nvmlDevice_t device, nvmlPciInfo_t *pci) { LOCKED(pci_impl(device, pci)); }
EXPORT nvmlReturn_t nvmlDeviceGetPciInfo(nvmlDevice_t device, nvmlPciInfo_t *pci) { LOCKED(pci_impl(device, pci)); }

static nvmlReturn_t pci_ext_impl(nvmlDevice_t d, nvmlPciInfoExt_t *pci)
{
    if (!pci)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (pci->version != nvmlPciInfoExt_v1)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    devref r;
    nvmlReturn_t rc = dev_get(d, &r, 0);
    if (rc != NVML_SUCCESS)
        return rc;
    pci->domain = r.p->domain;
    pci->bus = r.p->bus;
    pci->device = r.p->device;
    pci->pciDeviceId = r.p->pci_device_id;
    pci->pciSubSystemId = r.p->pci_subsystem_id;
    pci->baseClass = 0x03; /* display controller */
    pci->subClass = 0x02;  /* 3D controller */
    snprintf(pci->busId, sizeof pci->busId, "%s", r.p->pci_bus_id);
    return NVML_SUCCESS;
}
EXPORT nvmlReturn_t nvmlDeviceGetPciInfoExt(nvmlDevice_t device, nvmlPciInfoExt_t *pci)
{
    LOCKED(pci_ext_impl(device, pci));
}

/* ---- NUMA, affinity, topology ---- */
static const mock_numa *numa_of(const mock_gpu *g)
{
    for (unsigned i = 0; g->numa_node >= 0 && i < g_prof.nnuma; i++)
        if (g_prof.numa[i].id == g->numa_node)
            return &g_prof.numa[i];
    return NULL;
}

static nvmlReturn_t cpu_affinity_impl(nvmlDevice_t d, unsigned int size, unsigned long *set)
{
    if (!set || size == 0)
        return NVML_ERROR_INVALID_ARGUMENT;
    devref r;
    nvmlReturn_t rc = dev_get(d, &r, 0);
    if (rc != NVML_SUCCESS)
        return rc;
    const mock_numa *n = numa_of(r.p);
    if (!n)
        return NVML_ERROR_NOT_SUPPORTED;
    for (unsigned i = 0; i < size; i++)
        set[i] = i < MOCK_CPU_WORDS ? n->cpus[i] : 0;
    return NVML_SUCCESS;
}
EXPORT nvmlReturn_t nvmlDeviceGetCpuAffinity(nvmlDevice_t device, unsigned int cpuSetSize,
                                             unsigned long *cpuSet)
{
    LOCKED(cpu_affinity_impl(device, cpuSetSize, cpuSet));
}
EXPORT nvmlReturn_t nvmlDeviceGetCpuAffinityWithinScope(nvmlDevice_t device, unsigned int cpuSetSize,
                                                        unsigned long *cpuSet,
                                                        nvmlAffinityScope_t scope)
{
    if (scope != NVML_AFFINITY_SCOPE_NODE && scope != NVML_AFFINITY_SCOPE_SOCKET)
        return NVML_ERROR_INVALID_ARGUMENT;
    LOCKED(cpu_affinity_impl(device, cpuSetSize, cpuSet));
}

static nvmlReturn_t mem_affinity_impl(nvmlDevice_t d, unsigned int size, unsigned long *set)
{
    if (!set || size == 0)
        return NVML_ERROR_INVALID_ARGUMENT;
    devref r;
    nvmlReturn_t rc = dev_get(d, &r, 0);
    if (rc != NVML_SUCCESS)
        return rc;
    if (r.p->numa_node < 0)
        return NVML_ERROR_NOT_SUPPORTED;
    unsigned bits = 8 * sizeof(unsigned long), node = (unsigned)r.p->numa_node;
    for (unsigned i = 0; i < size; i++)
        set[i] = (node / bits == i) ? 1UL << (node % bits) : 0;
    return NVML_SUCCESS;
}
EXPORT nvmlReturn_t nvmlDeviceGetMemoryAffinity(nvmlDevice_t device, unsigned int nodeSetSize,
                                                unsigned long *nodeSet, nvmlAffinityScope_t scope)
{
    if (scope != NVML_AFFINITY_SCOPE_NODE && scope != NVML_AFFINITY_SCOPE_SOCKET)
        return NVML_ERROR_INVALID_ARGUMENT;
    LOCKED(mem_affinity_impl(device, nodeSetSize, nodeSet));
}

static nvmlGpuTopologyLevel_t level_between(unsigned a, unsigned b)
{
    const mock_gpu *x = &g_prof.gpu[a], *y = &g_prof.gpu[b];
    if (a == b)
        return NVML_TOPOLOGY_INTERNAL;
    if (x->pcie_switch >= 0 && x->pcie_switch == y->pcie_switch)
        return NVML_TOPOLOGY_SINGLE;
    if (x->numa_node >= 0 && x->numa_node == y->numa_node)
        return NVML_TOPOLOGY_NODE;
    return NVML_TOPOLOGY_SYSTEM;
}

static nvmlReturn_t ancestor_impl(nvmlDevice_t d1, nvmlDevice_t d2, nvmlGpuTopologyLevel_t *level)
{
    if (!level)
        return NVML_ERROR_INVALID_ARGUMENT;
    devref a, b;
    nvmlReturn_t rc = dev_get(d1, &a, 0);
    if (rc == NVML_SUCCESS)
        rc = dev_get(d2, &b, 0);
    if (rc == NVML_SUCCESS)
        *level = level_between(a.gpu, b.gpu);
    return rc;
}
EXPORT nvmlReturn_t nvmlDeviceGetTopologyCommonAncestor(nvmlDevice_t device1, nvmlDevice_t device2,
                                                        nvmlGpuTopologyLevel_t *pathInfo)
{
    LOCKED(ancestor_impl(device1, device2, pathInfo));
}

static nvmlReturn_t fill_devices(const int *match, unsigned int *count, nvmlDevice_t *arr)
{
    unsigned n = 0;
    for (unsigned i = 0; i < g_prof.ngpu; i++)
        n += match[i] != 0;
    if (*count == 0) {
        *count = n;
        return NVML_SUCCESS;
    }
    if (!arr)
        return NVML_ERROR_INVALID_ARGUMENT;
    unsigned k = 0;
    for (unsigned i = 0; i < g_prof.ngpu && k < *count; i++)
        if (match[i])
            arr[k++] = &g_dev_handles[i];
    *count = k;
    return NVML_SUCCESS;
}

static nvmlReturn_t nearest_impl(nvmlDevice_t d, nvmlGpuTopologyLevel_t level, unsigned int *count,
                                 nvmlDevice_t *arr)
{
    if (!count)
        return NVML_ERROR_INVALID_ARGUMENT;
    devref r;
    nvmlReturn_t rc = dev_get(d, &r, 0);
    if (rc != NVML_SUCCESS)
        return rc;
    int match[MOCK_MAX_GPUS] = {0};
    for (unsigned i = 0; i < g_prof.ngpu; i++)
        match[i] = i != r.gpu && level_between(r.gpu, i) <= level;
    return fill_devices(match, count, arr);
}
EXPORT nvmlReturn_t nvmlDeviceGetTopologyNearestGpus(nvmlDevice_t device, nvmlGpuTopologyLevel_t level,
                                                     unsigned int *count, nvmlDevice_t *deviceArray)
{
    LOCKED(nearest_impl(device, level, count, deviceArray));
}

static nvmlReturn_t gpuset_impl(unsigned int cpu, unsigned int *count, nvmlDevice_t *arr)
{
    if (!count || cpu >= MOCK_MAX_CPUS)
        return NVML_ERROR_INVALID_ARGUMENT;
    int match[MOCK_MAX_GPUS] = {0};
    unsigned bits = 8 * sizeof(unsigned long);
    for (unsigned i = 0; i < g_prof.ngpu; i++) {
        const mock_numa *n = numa_of(&g_prof.gpu[i]);
        match[i] = n && (n->cpus[cpu / bits] >> (cpu % bits) & 1UL);
    }
    return fill_devices(match, count, arr);
}
EXPORT nvmlReturn_t nvmlSystemGetTopologyGpuSet(unsigned int cpuNumber, unsigned int *count,
                                                nvmlDevice_t *deviceArray)
{
    LOCKED(gpuset_impl(cpuNumber, count, deviceArray));
}

/* ---- NVLink: links 0..nvlink_links-1; link i wired to nvlink_peers[i % n] (a GPU) or to
 * nvlink_switches[i % n] (an NVSwitch of the baseboard, as on DGX A100/H100) ---- */
enum { END_NONE, END_GPU, END_SWITCH };
typedef struct {
    int kind;
    unsigned index; /* GPU index or NVSwitch index */
} link_end;

static link_end link_far_end(const mock_gpu *g, unsigned link)
{
    link_end e = {END_NONE, 0};
    if (g->n_nvlink_peers) {
        e.kind = END_GPU;
        e.index = (unsigned)g->nvlink_peers[link % g->n_nvlink_peers];
    } else if (g->n_nvlink_switches) {
        e.kind = END_SWITCH;
        e.index = (unsigned)g->nvlink_switches[link % g->n_nvlink_switches];
    }
    return e;
}

static nvmlReturn_t link_get(nvmlDevice_t d, unsigned int link, devref *r, link_end *end)
{
    nvmlReturn_t rc = dev_get(d, r, 0);
    if (rc != NVML_SUCCESS)
        return rc;
    if (!r->p->nvlink_links)
        return NVML_ERROR_NOT_SUPPORTED;
    if (link >= r->p->nvlink_links)
        return NVML_ERROR_INVALID_ARGUMENT;
    *end = link_far_end(r->p, link);
    return NVML_SUCCESS;
}

static nvmlReturn_t link_state_impl(nvmlDevice_t d, unsigned int link, nvmlEnableState_t *active)
{
    if (!active)
        return NVML_ERROR_INVALID_ARGUMENT;
    devref r;
    link_end e;
    nvmlReturn_t rc = link_get(d, link, &r, &e);
    if (rc != NVML_SUCCESS)
        return rc;
    /* A link to a lost GPU goes down; a link to a switch stays up whatever other GPUs do. */
    int up = e.kind == END_SWITCH || (e.kind == END_GPU && !g_state.gpu[e.index].lost);
    *active = up ? NVML_FEATURE_ENABLED : NVML_FEATURE_DISABLED;
    return NVML_SUCCESS;
}
EXPORT nvmlReturn_t nvmlDeviceGetNvLinkState(nvmlDevice_t device, unsigned int link,
                                             nvmlEnableState_t *isActive)
{
    LOCKED(link_state_impl(device, link, isActive));
}

static nvmlReturn_t link_version_impl(nvmlDevice_t d, unsigned int link, unsigned int *version)
{
    if (!version)
        return NVML_ERROR_INVALID_ARGUMENT;
    devref r;
    link_end e;
    nvmlReturn_t rc = link_get(d, link, &r, &e);
    if (rc == NVML_SUCCESS)
        *version = r.p->nvlink_version;
    return rc;
}
EXPORT nvmlReturn_t nvmlDeviceGetNvLinkVersion(nvmlDevice_t device, unsigned int link,
                                               unsigned int *version)
{
    LOCKED(link_version_impl(device, link, version));
}

static nvmlReturn_t link_cap_impl(nvmlDevice_t d, unsigned int link, nvmlNvLinkCapability_t cap,
                                  unsigned int *result)
{
    if (!result || (unsigned)cap >= NVML_NVLINK_CAP_COUNT)
        return NVML_ERROR_INVALID_ARGUMENT;
    devref r;
    link_end e;
    nvmlReturn_t rc = link_get(d, link, &r, &e);
    if (rc == NVML_SUCCESS)
        *result = e.kind != END_NONE;
    return rc;
}
EXPORT nvmlReturn_t nvmlDeviceGetNvLinkCapability(nvmlDevice_t device, unsigned int link,
                                                  nvmlNvLinkCapability_t capability,
                                                  unsigned int *capResult)
{
    LOCKED(link_cap_impl(device, link, capability, capResult));
}

static void fill_switch_pci(const mock_nvswitch *sw, nvmlPciInfo_t *pci)
{
    memset(pci, 0, sizeof *pci);
    snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, "%04X:%02X:%02X.0", sw->domain & 0xffff,
             sw->bus, sw->device);
    snprintf(pci->busId, sizeof pci->busId, "%s", sw->pci_bus_id);
    pci->domain = sw->domain;
    pci->bus = sw->bus;
    pci->device = sw->device;
    pci->pciDeviceId = sw->pci_device_id;
    pci->pciSubSystemId = sw->pci_subsystem_id;
}

static nvmlReturn_t link_remote_impl(nvmlDevice_t d, unsigned int link, nvmlPciInfo_t *pci)
{
    if (!pci)
        return NVML_ERROR_INVALID_ARGUMENT;
    devref r;
    link_end e;
    nvmlReturn_t rc = link_get(d, link, &r, &e);
    if (rc != NVML_SUCCESS)
        return rc;
    if (e.kind == END_GPU)
        fill_pci(&g_prof.gpu[e.index], pci);
    else if (e.kind == END_SWITCH)
        fill_switch_pci(&g_prof.nvswitch[e.index], pci);
    else
        return NVML_ERROR_NOT_FOUND;
    return NVML_SUCCESS;
}
EXPORT nvmlReturn_t nvmlDeviceGetNvLinkRemotePciInfo_v2(nvmlDevice_t device, unsigned int link,
                                                        nvmlPciInfo_t *pci)
{
    LOCKED(link_remote_impl(device, link, pci));
}
EXPORT nvmlReturn_t nvmlDeviceGetNvLinkRemotePciInfo(nvmlDevice_t device, unsigned int link,
                                                     nvmlPciInfo_t *pci)
{
    LOCKED(link_remote_impl(device, link, pci));
}

static nvmlReturn_t link_remote_type_impl(nvmlDevice_t d, unsigned int link,
                                          nvmlIntNvLinkDeviceType_t *type)
{
    if (!type)
        return NVML_ERROR_INVALID_ARGUMENT;
    devref r;
    link_end e;
    nvmlReturn_t rc = link_get(d, link, &r, &e);
    if (rc == NVML_SUCCESS)
        *type = e.kind == END_GPU      ? NVML_NVLINK_DEVICE_TYPE_GPU
                : e.kind == END_SWITCH ? NVML_NVLINK_DEVICE_TYPE_SWITCH
                                       : NVML_NVLINK_DEVICE_TYPE_UNKNOWN;
    return rc;
}
EXPORT nvmlReturn_t nvmlDeviceGetNvLinkRemoteDeviceType(nvmlDevice_t device, unsigned int link,
                                                        nvmlIntNvLinkDeviceType_t *pNvLinkDeviceType)
{
    LOCKED(link_remote_type_impl(device, link, pNvLinkDeviceType));
}

/* GPUs talk over NVLink when a link joins them or both reach the same NVSwitch (the switches
 * of one baseboard forward between any two of its GPUs). */
static int nvlink_connected(const mock_gpu *a, unsigned b_index)
{
    const mock_gpu *b = &g_prof.gpu[b_index];
    for (unsigned i = 0; i < a->n_nvlink_peers; i++)
        if (a->nvlink_peers[i] == (int)b_index)
            return 1;
    for (unsigned i = 0; i < a->n_nvlink_switches; i++)
        for (unsigned j = 0; j < b->n_nvlink_switches; j++)
            if (a->nvlink_switches[i] == b->nvlink_switches[j])
                return 1;
    return 0;
}

static nvmlReturn_t p2p_impl(nvmlDevice_t d1, nvmlDevice_t d2, nvmlGpuP2PCapsIndex_t idx,
                             nvmlGpuP2PStatus_t *status)
{
    if (!status || idx >= NVML_P2P_CAPS_INDEX_UNKNOWN)
        return NVML_ERROR_INVALID_ARGUMENT;
    devref a, b;
    nvmlReturn_t rc = dev_get(d1, &a, 0);
    if (rc == NVML_SUCCESS)
        rc = dev_get(d2, &b, 0);
    if (rc != NVML_SUCCESS)
        return rc;
    if (idx == NVML_P2P_CAPS_INDEX_NVLINK)
        *status = a.gpu != b.gpu && a.p->nvlink_links && b.p->nvlink_links &&
                          nvlink_connected(a.p, b.gpu)
                      ? NVML_P2P_STATUS_OK
                      : NVML_P2P_STATUS_NOT_SUPPORTED;
    else
        *status = NVML_P2P_STATUS_OK;
    return NVML_SUCCESS;
}
EXPORT nvmlReturn_t nvmlDeviceGetP2PStatus(nvmlDevice_t device1, nvmlDevice_t device2,
                                           nvmlGpuP2PCapsIndex_t p2pIndex,
                                           nvmlGpuP2PStatus_t *p2pStatus)
{
    LOCKED(p2p_impl(device1, device2, p2pIndex, p2pStatus));
}

/* ---- processes ---- */
enum { PROCS_COMPUTE, PROCS_GRAPHICS, PROCS_MPS };
/* Compute lists the processes holding a context (an MPS server, not its clients); MPS lists
 * the clients of MPS servers; graphics none (the lab has no display work). */
static nvmlReturn_t procs_impl(nvmlDevice_t d, unsigned int *count, void *infos, int version,
                               int kind)
{
    if (!count)
        return NVML_ERROR_INVALID_ARGUMENT;
    devref r;
    nvmlReturn_t rc = dev_get(d, &r, DEV_ALLOW_MIG);
    if (rc != NVML_SUCCESS)
        return rc;
    mock_work all[MOCK_MAX_WORK], *match[MOCK_MAX_WORK];
    unsigned total = kind == PROCS_GRAPHICS ? 0 : mock_work_of(r.gpu, all, MOCK_MAX_WORK), n = 0;
    for (unsigned i = 0; i < total; i++)
        if (work_on(&r, &all[i]) && all[i].mps == (kind == PROCS_MPS))
            match[n++] = &all[i];
    if (*count < n) {
        *count = n;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    if (n && !infos)
        return NVML_ERROR_INVALID_ARGUMENT;
    for (unsigned i = 0; i < n; i++) {
        if (version == 1) {
            nvmlProcessInfo_v1_t *o = (nvmlProcessInfo_v1_t *)infos + i;
            o->pid = match[i]->pid;
            o->usedGpuMemory = match[i]->used_bytes;
        } else {
            nvmlProcessInfo_t *o = (nvmlProcessInfo_t *)infos + i;
            o->pid = match[i]->pid;
            o->usedGpuMemory = match[i]->used_bytes;
            o->gpuInstanceId = match[i]->gi;
            o->computeInstanceId = match[i]->ci;
        }
    }
    *count = n;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device, unsigned int *infoCount,
                                                            nvmlProcessInfo_t *infos)
{
    LOCKED(procs_impl(device, infoCount, infos, 3, PROCS_COMPUTE));
}
EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t device, unsigned int *infoCount,
                                                            nvmlProcessInfo_v2_t *infos)
{
    LOCKED(procs_impl(device, infoCount, infos, 2, PROCS_COMPUTE));
}
EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t device, unsigned int *infoCount,
                                                         nvmlProcessInfo_v1_t *infos)
{
    LOCKED(procs_impl(device, infoCount, infos, 1, PROCS_COMPUTE));
}
EXPORT nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v3(nvmlDevice_t device, unsigned int *infoCount,
                                                             nvmlProcessInfo_t *infos)
{
    LOCKED(procs_impl(device, infoCount, infos, 3, PROCS_GRAPHICS));
}
EXPORT nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v2(nvmlDevice_t device, unsigned int *infoCount,
                                                             nvmlProcessInfo_v2_t *infos)
{
    LOCKED(procs_impl(device, infoCount, infos, 2, PROCS_GRAPHICS));
}
EXPORT nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses(nvmlDevice_t device, unsigned int *infoCount,
                                                          nvmlProcessInfo_v1_t *infos)
{
    LOCKED(procs_impl(device, infoCount, infos, 1, PROCS_GRAPHICS));
}
EXPORT nvmlReturn_t nvmlDeviceGetMPSComputeRunningProcesses_v3(nvmlDevice_t device, unsigned int *infoCount,
                                                               nvmlProcessInfo_t *infos)
{
    LOCKED(procs_impl(device, infoCount, infos, 3, PROCS_MPS));
}

/* ---- attributes (MIG device handles only, as on real NVML) ---- */
static nvmlReturn_t attributes_impl(nvmlDevice_t d, nvmlDeviceAttributes_t *a)
{
    if (!a)
        return NVML_ERROR_INVALID_ARGUMENT;
    devref r;
    nvmlReturn_t rc = dev_get(d, &r, DEV_ALLOW_MIG);
    if (rc != NVML_SUCCESS)
        return rc;
    if (!r.mig)
        return NVML_ERROR_NOT_SUPPORTED;
    const mock_gi_profile *gp;
    const mock_ci_profile *cp;
    mig_profiles_of(&r, &gp, &cp);
    if (!gp || !cp)
        return NVML_ERROR_UNKNOWN;
    memset(a, 0, sizeof *a);
    a->multiprocessorCount = mig_ci_multiprocessors(gp, cp);
    a->sharedCopyEngineCount = gp->engines.copy;
    a->sharedDecoderCount = gp->engines.decoder;
    a->sharedEncoderCount = gp->engines.encoder;
    a->sharedJpegCount = gp->engines.jpeg;
    a->sharedOfaCount = gp->engines.ofa;
    a->gpuInstanceSliceCount = gp->compute_slices;
    a->computeInstanceSliceCount = cp->slices;
    a->memorySizeMB = gp->memory_mb;
    return NVML_SUCCESS;
}
EXPORT nvmlReturn_t nvmlDeviceGetAttributes_v2(nvmlDevice_t device, nvmlDeviceAttributes_t *attributes)
{
    LOCKED(attributes_impl(device, attributes));
}
EXPORT nvmlReturn_t nvmlDeviceGetAttributes(nvmlDevice_t device, nvmlDeviceAttributes_t *attributes)
{
    LOCKED(attributes_impl(device, attributes));
}

/* ---- NVLink fabric (GB200 NVL72 and other multi-node NVLink systems): the GPU's registration
 * with the fabric manager as the profile's `fabric` declares it; NOT_SUPPORTED without one ---- */
static nvmlReturn_t fabric_get(nvmlDevice_t d, const void *out, devref *r)
{
    if (!out)
        return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t rc = dev_get(d, r, 0);
    if (rc != NVML_SUCCESS)
        return rc;
    return r->p->has_fabric ? NVML_SUCCESS : NVML_ERROR_NOT_SUPPORTED;
}

/* The fields every version of the fabric struct has (the structs differ, the names do not). */
#define FABRIC_COMMON(dst, p)                                                         \
    do {                                                                             \
        memcpy((dst)->clusterUuid, (p)->fabric_cluster_uuid, sizeof (dst)->clusterUuid); \
        (dst)->status = (nvmlReturn_t)(p)->fabric_status;                            \
        (dst)->state = (nvmlGpuFabricState_t)(p)->fabric_state;                      \
    } while (0)

static nvmlReturn_t fabric_v1_impl(nvmlDevice_t d, nvmlGpuFabricInfo_t *info)
{
    devref r;
    nvmlReturn_t rc = fabric_get(d, info, &r);
    if (rc != NVML_SUCCESS)
        return rc;
    memset(info, 0, sizeof *info);
    FABRIC_COMMON(info, r.p);
    info->cliqueId = r.p->fabric_clique_id;
    return NVML_SUCCESS;
}
EXPORT nvmlReturn_t nvmlDeviceGetGpuFabricInfo(nvmlDevice_t device,
                                               nvmlGpuFabricInfo_t *gpuFabricInfo)
{
    LOCKED(fabric_v1_impl(device, gpuFabricInfo));
}

/* The versioned call: v2 (pynvml's c_nvmlGpuFabricInfoV_t, go-nvml's V2()) or v3 (adds
 * healthSummary); only the caller's version's bytes are written. */
static nvmlReturn_t fabric_v_impl(nvmlDevice_t d, nvmlGpuFabricInfoV_t *info)
{
    if (info && info->version != nvmlGpuFabricInfo_v2 && info->version != nvmlGpuFabricInfo_v3)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    devref r;
    nvmlReturn_t rc = fabric_get(d, info, &r);
    if (rc != NVML_SUCCESS)
        return rc;
    if (info->version == nvmlGpuFabricInfo_v2) {
        nvmlGpuFabricInfo_v2_t *v2 = (nvmlGpuFabricInfo_v2_t *)info;
        memset(v2, 0, sizeof *v2);
        v2->version = nvmlGpuFabricInfo_v2;
        FABRIC_COMMON(v2, r.p);
        v2->cliqueId = r.p->fabric_clique_id;
        v2->healthMask = r.p->fabric_health_mask;
        return NVML_SUCCESS;
    }
    memset(info, 0, sizeof *info);
    info->version = nvmlGpuFabricInfo_v3;
    FABRIC_COMMON(info, r.p);
    info->cliqueId = r.p->fabric_clique_id;
    info->healthMask = r.p->fabric_health_mask;
    info->healthSummary = (unsigned char)r.p->fabric_health_summary;
    return NVML_SUCCESS;
}
EXPORT nvmlReturn_t nvmlDeviceGetGpuFabricInfoV(nvmlDevice_t device,
                                                nvmlGpuFabricInfoV_t *gpuFabricInfo)
{
    LOCKED(fabric_v_impl(device, gpuFabricInfo));
}

#ifdef NVML_GPU_FABRIC_CLIQUE_MAX
/* nvml.h's per-type clique call (newer headers): the profile's clique id as the one unicast
 * pointer clique, the id v3 reports. The other clique types a Blackwell driver adds are not
 * modelled (their ids were not recorded). */
static nvmlReturn_t fabric_v4_impl(nvmlDevice_t d, nvmlGpuFabricInfo_v4_t *info)
{
    devref r;
    nvmlReturn_t rc = fabric_get(d, info, &r);
    if (rc != NVML_SUCCESS)
        return rc;
    memset(info, 0, sizeof *info);
    FABRIC_COMMON(info, r.p);
    if (r.p->fabric_state == NVML_GPU_FABRIC_STATE_COMPLETED) {
        info->cliques[0].type = NVML_GPU_FABRIC_CLIQUE_TYPE_UNICAST_POINTER;
        info->cliques[0].id = r.p->fabric_clique_id;
        info->numCliques = 1;
    }
    info->healthMask = r.p->fabric_health_mask;
    info->healthSummary = (unsigned char)r.p->fabric_health_summary;
    return NVML_SUCCESS;
}
EXPORT nvmlReturn_t nvmlDeviceGetGpuFabricInfo_v4(nvmlDevice_t device,
                                                  nvmlGpuFabricInfo_v4_t *gpuFabricInfo)
{
    LOCKED(fabric_v4_impl(device, gpuFabricInfo));
}
#endif
