/*
 * gpukit mock NVML: Multi-Instance GPU.
 *
 * Rules (as the driver applies them):
 * - MIG mode changes are pending until the GPU is reset (gpukitMockResetGpu, i.e. `nvidia-smi -r`)
 *   unless the profile says mig_mode_change: immediate. Enabling while processes use the GPU leaves
 *   the change pending with activationStatus NVML_ERROR_IN_USE. Disabling with GPU instances present
 *   fails with NVML_ERROR_IN_USE.
 * - A GPU instance occupies its placement's memory slices; placements come from the profile table,
 *   a start that is not one of them is NVML_ERROR_INVALID_ARGUMENT, an occupied one (or too many of a
 *   profile, or not enough compute slices or media engines left) NVML_ERROR_INSUFFICIENT_RESOURCES.
 * - Without an explicit placement the lowest free placement is used.
 * - GPU instance ids follow the memory position (0 for the whole GPU, 1-2 halves, 3-6 quarters,
 *   7-14 eighths, upper half first), compute instance ids are the lowest free from 0.
 * - Destroying an instance that has compute instances or processes fails with NVML_ERROR_IN_USE.
 * - Profile ids, as the driver numbers them: nvmlDeviceGetGpuInstanceProfileInfo(V) takes an
 *   NVML_GPU_INSTANCE_PROFILE_* constant and reports the driver's id for it in `id` (an H100's or
 *   A100's 1-slice profile, constant 0, is id 19); every other call that takes a profileId
 *   (placements, remaining capacity, create, list, ProfileInfoByIdV) takes that driver id, and
 *   nvmlGpuInstanceGetInfo reports it. The state file keeps the constant.
 * - The profile table, placements, remaining capacity and the (empty) instance list answer with
 *   MIG disabled too, on a MIG-capable GPU; a GPU that is not MIG capable answers
 *   NVML_ERROR_NOT_SUPPORTED. Creating instances needs MIG enabled.
 * The answers of a MIG-disabled H100 (driver 580.159.04) are recorded in
 * tests/lab/nvml/data/h100-80gb-hbm3.driver-580.159.04.json and checked by tests/lab/nvml/test_fidelity.py.
 */
#include "mock.h"

#include <stdio.h>
#include <string.h>

typedef struct {
    unsigned gpu, gi;
    const mock_gpu *p;
    mock_gpu_state *s;
    const mock_gi_profile *gp;
} giref;

static int slot(const void *p, const void *base, size_t total, size_t elem)
{
    uintptr_t a = (uintptr_t)p, b = (uintptr_t)base;
    return a >= b && a < b + total && (a - b) % elem == 0;
}

/* A full GPU that is MIG capable (and, if need_enabled, in MIG mode). */
static nvmlReturn_t mig_dev(nvmlDevice_t d, devref *r, int need_enabled)
{
    nvmlReturn_t rc = dev_get(d, r, 0);
    if (rc == NVML_ERROR_NOT_SUPPORTED)
        return NVML_ERROR_INVALID_ARGUMENT; /* a MIG device handle where a GPU is expected */
    if (rc != NVML_SUCCESS)
        return rc;
    if (!r->p->mig)
        return NVML_ERROR_NOT_SUPPORTED;
    if (need_enabled && r->s->mig_current != NVML_DEVICE_MIG_ENABLE)
        return NVML_ERROR_NOT_SUPPORTED;
    return NVML_SUCCESS;
}

static nvmlReturn_t gi_get(nvmlGpuInstance_t h, giref *out)
{
    if (!h || !slot(h, g_gi_handles, sizeof g_gi_handles, sizeof(struct nvmlGpuInstance_st)))
        return NVML_ERROR_INVALID_ARGUMENT;
    out->gpu = h->gpu;
    out->gi = h->gi;
    if (out->gpu >= g_prof.ngpu)
        return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t rc = state_refresh();
    if (rc != NVML_SUCCESS)
        return rc;
    out->p = &g_prof.gpu[out->gpu];
    out->s = &g_state.gpu[out->gpu];
    if (out->s->lost)
        return NVML_ERROR_GPU_IS_LOST;
    if (!out->p->mig || out->s->mig_current != NVML_DEVICE_MIG_ENABLE || !out->s->gi[out->gi].used)
        return NVML_ERROR_INVALID_ARGUMENT; /* destroyed, or the GPU was reset */
    out->gp = mig_gi_profile(out->p->mig, out->s->gi[out->gi].profile_id);
    return out->gp ? NVML_SUCCESS : NVML_ERROR_UNKNOWN;
}

/* NVML_GPU_INSTANCE_PROFILE_* constants from here on are unknown to the driver the mock follows
 * (580.159.04 answers NVML_ERROR_INVALID_ARGUMENT for NVML_GPU_INSTANCE_PROFILE_3_SLICE_GFX, 0x11,
 * and above); a known constant the GPU has no profile for is NVML_ERROR_NOT_SUPPORTED. */
#define MOCK_GI_PROFILE_CONSTANTS_KNOWN NVML_GPU_INSTANCE_PROFILE_3_SLICE_GFX

/* A profile by NVML_GPU_INSTANCE_PROFILE_* constant (nvmlDeviceGetGpuInstanceProfileInfo(V)). */
static nvmlReturn_t gi_profile_of(const devref *r, unsigned profile, const mock_gi_profile **gp)
{
    if (profile >= MOCK_GI_PROFILE_CONSTANTS_KNOWN)
        return NVML_ERROR_INVALID_ARGUMENT;
    *gp = mig_gi_profile(r->p->mig, profile);
    return *gp ? NVML_SUCCESS : NVML_ERROR_NOT_SUPPORTED;
}

/* A profile by the driver's id (every other call taking a profileId). The real driver answers
 * NVML_ERROR_INVALID_ARGUMENT for ids that name no profile of the GPU (on an H100, 580.159.04,
 * a few ids of other GPUs' profiles answer NOT_FOUND or NOT_SUPPORTED instead: not modelled). */
static nvmlReturn_t gi_profile_by_id(const devref *r, unsigned id, const mock_gi_profile **gp)
{
    *gp = mig_gi_profile_by_driver_id(r->p->mig, id);
    return *gp ? NVML_SUCCESS : NVML_ERROR_INVALID_ARGUMENT;
}

/* ---- MIG mode ---- */
static nvmlReturn_t get_mode(nvmlDevice_t d, unsigned int *cur, unsigned int *pend)
{
    if (!cur || !pend)
        return NVML_ERROR_INVALID_ARGUMENT;
    devref r;
    nvmlReturn_t rc = mig_dev(d, &r, 0);
    if (rc != NVML_SUCCESS)
        return rc;
    *cur = r.s->mig_current;
    *pend = r.s->mig_pending;
    return NVML_SUCCESS;
}
EXPORT nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t device, unsigned int *currentMode,
                                         unsigned int *pendingMode)
{
    LOCKED(get_mode(device, currentMode, pendingMode));
}

static nvmlReturn_t set_mode(nvmlDevice_t d, unsigned int mode, nvmlReturn_t *activation)
{
    if (!activation || mode > NVML_DEVICE_MIG_ENABLE)
        return NVML_ERROR_INVALID_ARGUMENT;
    devref r;
    nvmlReturn_t rc = mig_dev(d, &r, 0);
    if (rc != NVML_SUCCESS)
        return rc;
    int fd;
    if ((rc = state_lock(&fd)) != NVML_SUCCESS)
        return rc;
    mock_gpu_state *gs = &g_state.gpu[r.gpu];
    if (gs->lost) {
        state_unlock(fd);
        return NVML_ERROR_GPU_IS_LOST;
    }
    if (mode == NVML_DEVICE_MIG_DISABLE && mock_gi_count(gs)) {
        state_unlock(fd);
        return NVML_ERROR_IN_USE; /* destroy the GPU instances first */
    }
    gs->mig_pending = mode;
    if (mode == gs->mig_current)
        *activation = NVML_SUCCESS; /* nothing to activate (or a pending change withdrawn) */
    else if (mock_gpu_busy(gs))
        *activation = NVML_ERROR_IN_USE; /* stays pending: processes hold the GPU */
    else if (r.p->mig_immediate) {
        mock_apply_reset(r.gpu);
        *activation = NVML_SUCCESS;
    } else
        *activation = NVML_ERROR_RESET_REQUIRED; /* pending until the GPU is reset */
    return state_commit(fd);
}
EXPORT nvmlReturn_t nvmlDeviceSetMigMode(nvmlDevice_t device, unsigned int mode,
                                         nvmlReturn_t *activationStatus)
{
    LOCKED(set_mode(device, mode, activationStatus));
}

/* ---- GPU instance profiles (answered whether MIG is enabled or not) ---- */
/* The fields nvmlGpuInstanceProfileInfo_t, _v2_t and _v3_t share, by the same names. */
#define GI_PROFILE_FIELDS(dst, gp)                       \
    do {                                                 \
        (dst)->id = (gp)->driver_id;                     \
        (dst)->sliceCount = (gp)->compute_slices;        \
        (dst)->instanceCount = (gp)->max_count;          \
        (dst)->multiprocessorCount = (gp)->multiprocessors; \
        (dst)->copyEngineCount = (gp)->engines.copy;     \
        (dst)->decoderCount = (gp)->engines.decoder;     \
        (dst)->encoderCount = (gp)->engines.encoder;     \
        (dst)->jpegCount = (gp)->engines.jpeg;           \
        (dst)->ofaCount = (gp)->engines.ofa;             \
        (dst)->memorySizeMB = (gp)->memory_mb;           \
    } while (0)

static nvmlReturn_t gi_info_common(nvmlDevice_t d, unsigned profile, int by_id,
                                   const mock_gi_profile **gp)
{
    devref r;
    nvmlReturn_t rc = mig_dev(d, &r, 0);
    if (rc != NVML_SUCCESS)
        return rc;
    return by_id ? gi_profile_by_id(&r, profile, gp) : gi_profile_of(&r, profile, gp);
}

static nvmlReturn_t gi_info_v1(nvmlDevice_t d, unsigned profile, nvmlGpuInstanceProfileInfo_t *info)
{
    if (!info)
        return NVML_ERROR_INVALID_ARGUMENT;
    const mock_gi_profile *gp;
    nvmlReturn_t rc = gi_info_common(d, profile, 0, &gp);
    if (rc != NVML_SUCCESS)
        return rc;
    memset(info, 0, sizeof *info);
    GI_PROFILE_FIELDS(info, gp);
    info->isP2pSupported = gp->p2p;
    return NVML_SUCCESS;
}
EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceProfileInfo(nvmlDevice_t device, unsigned int profile,
                                                        nvmlGpuInstanceProfileInfo_t *info)
{
    LOCKED(gi_info_v1(device, profile, info));
}

/* by_id: profile is the driver's id (ProfileInfoByIdV), else a constant (ProfileInfoV). */
static nvmlReturn_t gi_info_v(nvmlDevice_t d, unsigned profile, int by_id,
                              nvmlGpuInstanceProfileInfo_v2_t *info)
{
    if (!info)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (info->version != nvmlGpuInstanceProfileInfo_v2 &&
        info->version != nvmlGpuInstanceProfileInfo_v3)
        return NVML_ERROR_INVALID_ARGUMENT; /* what 580.159.04 answers for another version */
    const mock_gi_profile *gp;
    nvmlReturn_t rc = gi_info_common(d, profile, by_id, &gp);
    if (rc != NVML_SUCCESS)
        return rc;
    if (info->version == nvmlGpuInstanceProfileInfo_v3) {
        nvmlGpuInstanceProfileInfo_v3_t *v3 = (nvmlGpuInstanceProfileInfo_v3_t *)info;
        unsigned version = v3->version;
        memset(v3, 0, sizeof *v3);
        v3->version = version;
        GI_PROFILE_FIELDS(v3, gp);
        /* name left empty: 580.159.04 fills it in v2 but not in v3 (seen on a MIG-disabled H100) */
        v3->capabilities = gp->p2p ? NVML_GPU_INSTANCE_PROFILE_CAPS_P2P : 0;
        return NVML_SUCCESS;
    }
    unsigned version = info->version;
    memset(info, 0, sizeof *info);
    info->version = version;
    GI_PROFILE_FIELDS(info, gp);
    info->isP2pSupported = gp->p2p;
    snprintf(info->name, sizeof info->name, "MIG %s", gp->name);
    return NVML_SUCCESS;
}
EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceProfileInfoV(nvmlDevice_t device, unsigned int profile,
                                                         nvmlGpuInstanceProfileInfo_v2_t *info)
{
    LOCKED(gi_info_v(device, profile, 0, info));
}
EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceProfileInfoByIdV(nvmlDevice_t device, unsigned int profileId,
                                                             nvmlGpuInstanceProfileInfo_v2_t *info)
{
    LOCKED(gi_info_v(device, profileId, 1, info));
}

/* v1: the deprecated entry point, which 580.159.04 refuses (NOT_SUPPORTED) for a profile with
 * more placements than instances (an H100's 1g.10gb+me: 7 placements, 1 instance) while _v2 lists
 * them; modelled on that one observation. */
static nvmlReturn_t gi_placements(nvmlDevice_t d, unsigned id, nvmlGpuInstancePlacement_t *pl,
                                  unsigned int *count, int v1)
{
    if (!count)
        return NVML_ERROR_INVALID_ARGUMENT;
    devref r;
    nvmlReturn_t rc = mig_dev(d, &r, 0); /* placements are known whether MIG is on or not */
    const mock_gi_profile *gp;
    if (rc == NVML_SUCCESS)
        rc = gi_profile_by_id(&r, id, &gp);
    if (rc != NVML_SUCCESS)
        return rc;
    if (v1 && gp->max_count < gp->nplacements)
        return NVML_ERROR_NOT_SUPPORTED;
    if (pl)
        for (unsigned i = 0; i < gp->nplacements; i++) {
            pl[i].start = gp->placements[i];
            pl[i].size = gp->memory_slices;
        }
    *count = gp->nplacements;
    return NVML_SUCCESS;
}
EXPORT nvmlReturn_t nvmlDeviceGetGpuInstancePossiblePlacements_v2(nvmlDevice_t device, unsigned int profileId,
                                                                  nvmlGpuInstancePlacement_t *placements,
                                                                  unsigned int *count)
{
    LOCKED(gi_placements(device, profileId, placements, count, 0));
}
EXPORT nvmlReturn_t nvmlDeviceGetGpuInstancePossiblePlacements(nvmlDevice_t device, unsigned int profileId,
                                                               nvmlGpuInstancePlacement_t *placements,
                                                               unsigned int *count)
{
    LOCKED(gi_placements(device, profileId, placements, count, 1));
}

/* ---- GPU instance capacity checks ---- */
static nvmlReturn_t gi_fits(const mock_mig_table *t, const mock_gpu_state *gs,
                            const mock_gi_profile *gp, unsigned start)
{
    unsigned count = 0, compute = 0;
    mock_engines e = {0, 0, 0, 0, 0};
    for (unsigned g = 0; g < MOCK_MAX_GI; g++) {
        const mock_gi_state *gi = &gs->gi[g];
        if (!gi->used)
            continue;
        if (start < gi->start + gi->size && gi->start < start + gp->memory_slices)
            return NVML_ERROR_INSUFFICIENT_RESOURCES; /* memory slices taken */
        const mock_gi_profile *other = mig_gi_profile(t, gi->profile_id);
        if (!other)
            continue;
        count += gi->profile_id == gp->profile_id;
        compute += other->compute_slices;
        e.copy += other->engines.copy;
        e.decoder += other->engines.decoder;
        e.encoder += other->engines.encoder;
        e.jpeg += other->engines.jpeg;
        e.ofa += other->engines.ofa;
    }
    if (count >= gp->max_count || compute + gp->compute_slices > t->compute_slices ||
        e.copy + gp->engines.copy > t->engines.copy ||
        e.decoder + gp->engines.decoder > t->engines.decoder ||
        e.encoder + gp->engines.encoder > t->engines.encoder ||
        e.jpeg + gp->engines.jpeg > t->engines.jpeg || e.ofa + gp->engines.ofa > t->engines.ofa)
        return NVML_ERROR_INSUFFICIENT_RESOURCES;
    return NVML_SUCCESS;
}

static int valid_start(const mock_gi_profile *gp, unsigned start)
{
    for (unsigned i = 0; i < gp->nplacements; i++)
        if (gp->placements[i] == start)
            return 1;
    return 0;
}

static unsigned gi_id_for(const mock_mig_table *t, const mock_gpu_state *gs, unsigned start,
                          unsigned size)
{
    unsigned n = size ? t->memory_slices / size : 0;
    if (t->memory_slices == 8 && n * size == 8 && (n & (n - 1)) == 0 && start % size == 0) {
        unsigned p = start / size;
        return (n - 1) + (n > 1 ? (p + n / 2) % n : 0);
    }
    for (unsigned g = 0; g < MOCK_MAX_GI; g++)
        if (!gs->gi[g].used)
            return g;
    return MOCK_NO_ID;
}

static nvmlReturn_t remaining(nvmlDevice_t d, unsigned id, unsigned int *count)
{
    if (!count)
        return NVML_ERROR_INVALID_ARGUMENT;
    devref r;
    const mock_gi_profile *gp;
    nvmlReturn_t rc = mig_dev(d, &r, 0); /* MIG disabled: no instances, all of it remains */
    if (rc == NVML_SUCCESS)
        rc = gi_profile_by_id(&r, id, &gp);
    if (rc != NVML_SUCCESS)
        return rc;
    /* Greedy fill on a scratch copy: placements of one profile never overlap each other. */
    static mock_gpu_state scratch;
    scratch = *r.s;
    unsigned n = 0;
    for (unsigned i = 0; i < gp->nplacements; i++) {
        unsigned start = gp->placements[i];
        if (gi_fits(r.p->mig, &scratch, gp, start) != NVML_SUCCESS)
            continue;
        unsigned id = gi_id_for(r.p->mig, &scratch, start, gp->memory_slices);
        if (id == MOCK_NO_ID)
            break;
        scratch.gi[id] = (mock_gi_state){.used = 1, .profile_id = gp->profile_id, .start = start,
                                         .size = gp->memory_slices};
        n++;
    }
    *count = n;
    return NVML_SUCCESS;
}
EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceRemainingCapacity(nvmlDevice_t device, unsigned int profileId,
                                                              unsigned int *count)
{
    LOCKED(remaining(device, profileId, count));
}

/* ---- create / destroy / list GPU instances ---- */
static nvmlReturn_t gi_create(nvmlDevice_t d, unsigned profile_id, const nvmlGpuInstancePlacement_t *want,
                              nvmlGpuInstance_t *out)
{
    if (!out)
        return NVML_ERROR_INVALID_ARGUMENT;
    devref r;
    const mock_gi_profile *gp;
    nvmlReturn_t rc = mig_dev(d, &r, 1);
    if (rc == NVML_SUCCESS)
        rc = gi_profile_by_id(&r, profile_id, &gp);
    if (rc != NVML_SUCCESS)
        return rc;
    if (want && (want->size != gp->memory_slices || !valid_start(gp, want->start)))
        return NVML_ERROR_INVALID_ARGUMENT;
    int fd;
    if ((rc = state_lock(&fd)) != NVML_SUCCESS)
        return rc;
    /* Re-check against the state as it is now, under the lock. */
    mock_gpu_state *gs = &g_state.gpu[r.gpu];
    if (gs->lost || gs->mig_current != NVML_DEVICE_MIG_ENABLE) {
        state_unlock(fd);
        return gs->lost ? NVML_ERROR_GPU_IS_LOST : NVML_ERROR_NOT_SUPPORTED;
    }
    unsigned start = MOCK_NO_ID;
    if (want) {
        rc = gi_fits(r.p->mig, gs, gp, want->start);
        start = want->start;
    } else {
        rc = NVML_ERROR_INSUFFICIENT_RESOURCES;
        for (unsigned i = 0; i < gp->nplacements && rc != NVML_SUCCESS; i++) {
            rc = gi_fits(r.p->mig, gs, gp, gp->placements[i]);
            start = gp->placements[i];
        }
    }
    unsigned id = rc == NVML_SUCCESS ? gi_id_for(r.p->mig, gs, start, gp->memory_slices) : MOCK_NO_ID;
    if (rc == NVML_SUCCESS && (id == MOCK_NO_ID || gs->gi[id].used))
        rc = NVML_ERROR_INSUFFICIENT_RESOURCES;
    if (rc != NVML_SUCCESS) {
        state_unlock(fd);
        return rc;
    }
    memset(&gs->gi[id], 0, sizeof gs->gi[id]);
    gs->gi[id] = (mock_gi_state){.used = 1, .profile_id = gp->profile_id, .start = start,
                                 .size = gp->memory_slices};
    rc = state_commit(fd);
    if (rc == NVML_SUCCESS)
        *out = &g_gi_handles[r.gpu][id];
    return rc;
}
EXPORT nvmlReturn_t nvmlDeviceCreateGpuInstance(nvmlDevice_t device, unsigned int profileId,
                                                nvmlGpuInstance_t *gpuInstance)
{
    LOCKED(gi_create(device, profileId, NULL, gpuInstance));
}
EXPORT nvmlReturn_t nvmlDeviceCreateGpuInstanceWithPlacement(nvmlDevice_t device, unsigned int profileId,
                                                             const nvmlGpuInstancePlacement_t *placement,
                                                             nvmlGpuInstance_t *gpuInstance)
{
    if (!placement)
        return NVML_ERROR_INVALID_ARGUMENT;
    LOCKED(gi_create(device, profileId, placement, gpuInstance));
}

static int procs_in(const mock_gpu_state *gs, unsigned gi, unsigned ci)
{
    mock_work w[MOCK_MAX_WORK]; /* state records and live lab workloads alike */
    unsigned n = mock_work_of((unsigned)(gs - g_state.gpu), w, MOCK_MAX_WORK);
    for (unsigned i = 0; i < n; i++)
        if (w[i].gi == gi && (ci == MOCK_NO_ID || w[i].ci == ci))
            return 1;
    return 0;
}

static nvmlReturn_t gi_destroy(nvmlGpuInstance_t h)
{
    giref g;
    nvmlReturn_t rc = gi_get(h, &g);
    if (rc != NVML_SUCCESS)
        return rc;
    int fd;
    if ((rc = state_lock(&fd)) != NVML_SUCCESS)
        return rc;
    mock_gpu_state *gs = &g_state.gpu[g.gpu];
    mock_gi_state *gi = &gs->gi[g.gi];
    if (!gi->used) {
        state_unlock(fd);
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    for (unsigned c = 0; c < MOCK_MAX_CI; c++)
        if (gi->ci[c].used) {
            state_unlock(fd);
            return NVML_ERROR_IN_USE;
        }
    if (procs_in(gs, g.gi, MOCK_NO_ID)) {
        state_unlock(fd);
        return NVML_ERROR_IN_USE;
    }
    memset(gi, 0, sizeof *gi);
    return state_commit(fd);
}
EXPORT nvmlReturn_t nvmlGpuInstanceDestroy(nvmlGpuInstance_t gpuInstance) { LOCKED(gi_destroy(gpuInstance)); }

static nvmlReturn_t gi_list(nvmlDevice_t d, unsigned id, nvmlGpuInstance_t *arr, unsigned int *count)
{
    if (!arr || !count)
        return NVML_ERROR_INVALID_ARGUMENT;
    devref r;
    const mock_gi_profile *gp;
    nvmlReturn_t rc = mig_dev(d, &r, 0); /* MIG disabled: none */
    if (rc == NVML_SUCCESS)
        rc = gi_profile_by_id(&r, id, &gp);
    if (rc != NVML_SUCCESS)
        return rc;
    unsigned n = 0;
    for (unsigned g = 0; g < MOCK_MAX_GI; g++)
        if (r.s->gi[g].used && r.s->gi[g].profile_id == gp->profile_id)
            arr[n++] = &g_gi_handles[r.gpu][g];
    *count = n;
    return NVML_SUCCESS;
}
EXPORT nvmlReturn_t nvmlDeviceGetGpuInstances(nvmlDevice_t device, unsigned int profileId,
                                              nvmlGpuInstance_t *gpuInstances, unsigned int *count)
{
    LOCKED(gi_list(device, profileId, gpuInstances, count));
}

static nvmlReturn_t gi_by_id(nvmlDevice_t d, unsigned id, nvmlGpuInstance_t *out)
{
    if (!out)
        return NVML_ERROR_INVALID_ARGUMENT;
    devref r;
    nvmlReturn_t rc = mig_dev(d, &r, 0);
    if (rc != NVML_SUCCESS)
        return rc;
    if (r.s->mig_current != NVML_DEVICE_MIG_ENABLE)
        return NVML_ERROR_NOT_FOUND; /* as 580.159.04 answers on a MIG-disabled H100, any id */
    if (id >= MOCK_MAX_GI)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (!r.s->gi[id].used)
        return NVML_ERROR_NOT_FOUND;
    *out = &g_gi_handles[r.gpu][id];
    return NVML_SUCCESS;
}
EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceById(nvmlDevice_t device, unsigned int id,
                                                 nvmlGpuInstance_t *gpuInstance)
{
    LOCKED(gi_by_id(device, id, gpuInstance));
}

static nvmlReturn_t gi_info(nvmlGpuInstance_t h, nvmlGpuInstanceInfo_t *info)
{
    if (!info)
        return NVML_ERROR_INVALID_ARGUMENT;
    giref g;
    nvmlReturn_t rc = gi_get(h, &g);
    if (rc != NVML_SUCCESS)
        return rc;
    const mock_gi_state *gi = &g.s->gi[g.gi];
    info->device = &g_dev_handles[g.gpu];
    info->id = g.gi;
    info->profileId = g.gp->driver_id; /* the driver's id, as nvidia-smi mig -lgi shows it */
    info->placement.start = gi->start;
    info->placement.size = gi->size;
    return NVML_SUCCESS;
}
EXPORT nvmlReturn_t nvmlGpuInstanceGetInfo(nvmlGpuInstance_t gpuInstance, nvmlGpuInstanceInfo_t *info)
{
    LOCKED(gi_info(gpuInstance, info));
}

/* ---- compute instances ---- */
static nvmlReturn_t ci_profile_of(const giref *g, unsigned profile, unsigned eng,
                                  const mock_ci_profile **cp)
{
    if (profile >= NVML_COMPUTE_INSTANCE_PROFILE_COUNT || eng >= NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_COUNT)
        return NVML_ERROR_INVALID_ARGUMENT;
    *cp = mig_ci_profile(g->gp, profile);
    return *cp ? NVML_SUCCESS : NVML_ERROR_NOT_SUPPORTED;
}

/* The GPU instance behind `h` and its compute instance profile `profile` (engine profile `eng`). */
static nvmlReturn_t ci_lookup(nvmlGpuInstance_t h, unsigned profile, unsigned eng, giref *g,
                              const mock_ci_profile **cp)
{
    nvmlReturn_t rc = gi_get(h, g);
    return rc == NVML_SUCCESS ? ci_profile_of(g, profile, eng, cp) : rc;
}

/* The fields nvmlComputeInstanceProfileInfo_t, _v2_t and _v3_t share, by the same names. */
#define CI_PROFILE_FIELDS(dst, g, cp)                                   \
    do {                                                                \
        (dst)->id = (cp)->profile_id;                                   \
        (dst)->sliceCount = (cp)->slices;                               \
        (dst)->instanceCount = (cp)->max_count;                         \
        (dst)->multiprocessorCount = mig_ci_multiprocessors((g)->gp, (cp)); \
        (dst)->sharedCopyEngineCount = (g)->gp->engines.copy;           \
        (dst)->sharedDecoderCount = (g)->gp->engines.decoder;           \
        (dst)->sharedEncoderCount = (g)->gp->engines.encoder;           \
        (dst)->sharedJpegCount = (g)->gp->engines.jpeg;                 \
        (dst)->sharedOfaCount = (g)->gp->engines.ofa;                   \
    } while (0)

static void ci_name(const giref *g, const mock_ci_profile *cp, char *out, size_t n)
{
    if (cp->slices < g->gp->compute_slices)
        snprintf(out, n, "MIG %uc.%s", cp->slices, g->gp->name);
    else
        snprintf(out, n, "MIG %s", g->gp->name);
}

static nvmlReturn_t ci_info_v1(nvmlGpuInstance_t h, unsigned profile, unsigned eng,
                               nvmlComputeInstanceProfileInfo_t *info)
{
    if (!info)
        return NVML_ERROR_INVALID_ARGUMENT;
    giref g;
    const mock_ci_profile *cp;
    nvmlReturn_t rc = ci_lookup(h, profile, eng, &g, &cp);
    if (rc != NVML_SUCCESS)
        return rc;
    memset(info, 0, sizeof *info);
    CI_PROFILE_FIELDS(info, &g, cp);
    return NVML_SUCCESS;
}
EXPORT nvmlReturn_t nvmlGpuInstanceGetComputeInstanceProfileInfo(nvmlGpuInstance_t gpuInstance,
                                                                 unsigned int profile, unsigned int engProfile,
                                                                 nvmlComputeInstanceProfileInfo_t *info)
{
    LOCKED(ci_info_v1(gpuInstance, profile, engProfile, info));
}

static nvmlReturn_t ci_info_v(nvmlGpuInstance_t h, unsigned profile, unsigned eng,
                              nvmlComputeInstanceProfileInfo_v2_t *info)
{
    if (!info)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (info->version != nvmlComputeInstanceProfileInfo_v2 &&
        info->version != nvmlComputeInstanceProfileInfo_v3)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    giref g;
    const mock_ci_profile *cp;
    nvmlReturn_t rc = ci_lookup(h, profile, eng, &g, &cp);
    if (rc != NVML_SUCCESS)
        return rc;
    unsigned version = info->version;
    if (version == nvmlComputeInstanceProfileInfo_v3) {
        nvmlComputeInstanceProfileInfo_v3_t *v3 = (nvmlComputeInstanceProfileInfo_v3_t *)info;
        memset(v3, 0, sizeof *v3);
        v3->version = version;
        CI_PROFILE_FIELDS(v3, &g, cp);
        ci_name(&g, cp, v3->name, sizeof v3->name);
        return NVML_SUCCESS;
    }
    memset(info, 0, sizeof *info);
    info->version = version;
    CI_PROFILE_FIELDS(info, &g, cp);
    ci_name(&g, cp, info->name, sizeof info->name);
    return NVML_SUCCESS;
}
EXPORT nvmlReturn_t nvmlGpuInstanceGetComputeInstanceProfileInfoV(nvmlGpuInstance_t gpuInstance,
                                                                  unsigned int profile, unsigned int engProfile,
                                                                  nvmlComputeInstanceProfileInfo_v2_t *info)
{
    LOCKED(ci_info_v(gpuInstance, profile, engProfile, info));
}

static nvmlReturn_t ci_fits(const mock_gi_state *gi, const mock_gi_profile *gp,
                            const mock_ci_profile *cp, unsigned start)
{
    unsigned count = 0, slices = 0;
    for (unsigned c = 0; c < MOCK_MAX_CI; c++) {
        const mock_ci_state *ci = &gi->ci[c];
        if (!ci->used)
            continue;
        if (start < ci->start + ci->size && ci->start < start + cp->slices)
            return NVML_ERROR_INSUFFICIENT_RESOURCES;
        count += ci->profile_id == cp->profile_id;
        slices += ci->size;
    }
    if (count >= cp->max_count || slices + cp->slices > gp->compute_slices)
        return NVML_ERROR_INSUFFICIENT_RESOURCES;
    return NVML_SUCCESS;
}

static nvmlReturn_t ci_remaining(nvmlGpuInstance_t h, unsigned profile, unsigned int *count)
{
    if (!count)
        return NVML_ERROR_INVALID_ARGUMENT;
    giref g;
    const mock_ci_profile *cp;
    nvmlReturn_t rc = ci_lookup(h, profile, 0, &g, &cp);
    if (rc != NVML_SUCCESS)
        return rc;
    mock_gi_state scratch = g.s->gi[g.gi];
    unsigned n = 0;
    for (unsigned i = 0; i < cp->nplacements; i++) {
        if (ci_fits(&scratch, g.gp, cp, cp->placements[i]) != NVML_SUCCESS)
            continue;
        for (unsigned c = 0; c < MOCK_MAX_CI; c++)
            if (!scratch.ci[c].used) {
                scratch.ci[c] = (mock_ci_state){.used = 1, .profile_id = cp->profile_id,
                                                .start = cp->placements[i], .size = cp->slices};
                n++;
                break;
            }
    }
    *count = n;
    return NVML_SUCCESS;
}
EXPORT nvmlReturn_t nvmlGpuInstanceGetComputeInstanceRemainingCapacity(nvmlGpuInstance_t gpuInstance,
                                                                       unsigned int profileId,
                                                                       unsigned int *count)
{
    LOCKED(ci_remaining(gpuInstance, profileId, count));
}

static nvmlReturn_t ci_placements(nvmlGpuInstance_t h, unsigned profile,
                                  nvmlComputeInstancePlacement_t *pl, unsigned int *count)
{
    if (!count)
        return NVML_ERROR_INVALID_ARGUMENT;
    giref g;
    const mock_ci_profile *cp;
    nvmlReturn_t rc = ci_lookup(h, profile, 0, &g, &cp);
    if (rc != NVML_SUCCESS)
        return rc;
    if (pl)
        for (unsigned i = 0; i < cp->nplacements; i++) {
            pl[i].start = cp->placements[i];
            pl[i].size = cp->slices;
        }
    *count = cp->nplacements;
    return NVML_SUCCESS;
}
EXPORT nvmlReturn_t nvmlGpuInstanceGetComputeInstancePossiblePlacements(
    nvmlGpuInstance_t gpuInstance, unsigned int profileId, nvmlComputeInstancePlacement_t *placements,
    unsigned int *count)
{
    LOCKED(ci_placements(gpuInstance, profileId, placements, count));
}

static nvmlReturn_t ci_create(nvmlGpuInstance_t h, unsigned profile,
                              const nvmlComputeInstancePlacement_t *want, nvmlComputeInstance_t *out)
{
    if (!out)
        return NVML_ERROR_INVALID_ARGUMENT;
    giref g;
    const mock_ci_profile *cp;
    nvmlReturn_t rc = ci_lookup(h, profile, 0, &g, &cp);
    if (rc != NVML_SUCCESS)
        return rc;
    if (want) {
        int ok = want->size == cp->slices;
        int found = 0;
        for (unsigned i = 0; i < cp->nplacements; i++)
            found |= cp->placements[i] == want->start;
        if (!ok || !found)
            return NVML_ERROR_INVALID_ARGUMENT;
    }
    int fd;
    if ((rc = state_lock(&fd)) != NVML_SUCCESS)
        return rc;
    mock_gpu_state *gs = &g_state.gpu[g.gpu];
    mock_gi_state *gi = &gs->gi[g.gi];
    if (gs->lost || gs->mig_current != NVML_DEVICE_MIG_ENABLE || !gi->used) {
        state_unlock(fd);
        return gs->lost ? NVML_ERROR_GPU_IS_LOST : NVML_ERROR_INVALID_ARGUMENT;
    }
    unsigned start = 0;
    if (want) {
        start = want->start;
        rc = ci_fits(gi, g.gp, cp, start);
    } else {
        rc = NVML_ERROR_INSUFFICIENT_RESOURCES;
        for (unsigned i = 0; i < cp->nplacements && rc != NVML_SUCCESS; i++) {
            start = cp->placements[i];
            rc = ci_fits(gi, g.gp, cp, start);
        }
    }
    unsigned id = MOCK_NO_ID;
    for (unsigned c = 0; rc == NVML_SUCCESS && c < MOCK_MAX_CI && id == MOCK_NO_ID; c++)
        if (!gi->ci[c].used)
            id = c;
    if (rc == NVML_SUCCESS && id == MOCK_NO_ID)
        rc = NVML_ERROR_INSUFFICIENT_RESOURCES;
    if (rc != NVML_SUCCESS) {
        state_unlock(fd);
        return rc;
    }
    mock_ci_state *ci = &gi->ci[id];
    *ci = (mock_ci_state){.used = 1, .profile_id = cp->profile_id, .start = start, .size = cp->slices};
    char material[256];
    snprintf(material, sizeof material, "%s/mig/%u/%u/%llu", g.p->uuid, g.gi, id,
             gs->mig_counter++);
    mock_uuid(ci->uuid, sizeof ci->uuid, "MIG-", material);
    rc = state_commit(fd);
    if (rc == NVML_SUCCESS)
        *out = &g_ci_handles[g.gpu][g.gi][id];
    return rc;
}
EXPORT nvmlReturn_t nvmlGpuInstanceCreateComputeInstance(nvmlGpuInstance_t gpuInstance, unsigned int profileId,
                                                         nvmlComputeInstance_t *computeInstance)
{
    LOCKED(ci_create(gpuInstance, profileId, NULL, computeInstance));
}
EXPORT nvmlReturn_t nvmlGpuInstanceCreateComputeInstanceWithPlacement(
    nvmlGpuInstance_t gpuInstance, unsigned int profileId, const nvmlComputeInstancePlacement_t *placement,
    nvmlComputeInstance_t *computeInstance)
{
    if (!placement)
        return NVML_ERROR_INVALID_ARGUMENT;
    LOCKED(ci_create(gpuInstance, profileId, placement, computeInstance));
}

typedef struct {
    giref g;
    unsigned ci;
} ciref;

static nvmlReturn_t ci_get(nvmlComputeInstance_t h, ciref *out)
{
    if (!h || !slot(h, g_ci_handles, sizeof g_ci_handles, sizeof(struct nvmlComputeInstance_st)))
        return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t rc = gi_get(&g_gi_handles[h->gpu % MOCK_MAX_GPUS][h->gi % MOCK_MAX_GI], &out->g);
    if (rc != NVML_SUCCESS)
        return rc;
    out->ci = h->ci;
    return out->g.s->gi[out->g.gi].ci[h->ci].used ? NVML_SUCCESS : NVML_ERROR_INVALID_ARGUMENT;
}

static nvmlReturn_t ci_destroy(nvmlComputeInstance_t h)
{
    ciref c;
    nvmlReturn_t rc = ci_get(h, &c);
    if (rc != NVML_SUCCESS)
        return rc;
    int fd;
    if ((rc = state_lock(&fd)) != NVML_SUCCESS)
        return rc;
    mock_gpu_state *gs = &g_state.gpu[c.g.gpu];
    mock_ci_state *ci = &gs->gi[c.g.gi].ci[c.ci];
    if (!gs->gi[c.g.gi].used || !ci->used) {
        state_unlock(fd);
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    if (procs_in(gs, c.g.gi, c.ci)) {
        state_unlock(fd);
        return NVML_ERROR_IN_USE;
    }
    memset(ci, 0, sizeof *ci);
    return state_commit(fd);
}
EXPORT nvmlReturn_t nvmlComputeInstanceDestroy(nvmlComputeInstance_t computeInstance)
{
    LOCKED(ci_destroy(computeInstance));
}

static nvmlReturn_t ci_list(nvmlGpuInstance_t h, unsigned profile, nvmlComputeInstance_t *arr,
                            unsigned int *count)
{
    if (!arr || !count)
        return NVML_ERROR_INVALID_ARGUMENT;
    giref g;
    const mock_ci_profile *cp;
    nvmlReturn_t rc = ci_lookup(h, profile, 0, &g, &cp);
    if (rc != NVML_SUCCESS)
        return rc;
    unsigned n = 0;
    for (unsigned c = 0; c < MOCK_MAX_CI; c++)
        if (g.s->gi[g.gi].ci[c].used && g.s->gi[g.gi].ci[c].profile_id == profile)
            arr[n++] = &g_ci_handles[g.gpu][g.gi][c];
    *count = n;
    return NVML_SUCCESS;
}
EXPORT nvmlReturn_t nvmlGpuInstanceGetComputeInstances(nvmlGpuInstance_t gpuInstance, unsigned int profileId,
                                                       nvmlComputeInstance_t *computeInstances,
                                                       unsigned int *count)
{
    LOCKED(ci_list(gpuInstance, profileId, computeInstances, count));
}

static nvmlReturn_t ci_by_id(nvmlGpuInstance_t h, unsigned id, nvmlComputeInstance_t *out)
{
    if (!out || id >= MOCK_MAX_CI)
        return NVML_ERROR_INVALID_ARGUMENT;
    giref g;
    nvmlReturn_t rc = gi_get(h, &g);
    if (rc != NVML_SUCCESS)
        return rc;
    if (!g.s->gi[g.gi].ci[id].used)
        return NVML_ERROR_NOT_FOUND;
    *out = &g_ci_handles[g.gpu][g.gi][id];
    return NVML_SUCCESS;
}
EXPORT nvmlReturn_t nvmlGpuInstanceGetComputeInstanceById(nvmlGpuInstance_t gpuInstance, unsigned int id,
                                                          nvmlComputeInstance_t *computeInstance)
{
    LOCKED(ci_by_id(gpuInstance, id, computeInstance));
}

static nvmlReturn_t ci_info(nvmlComputeInstance_t h, nvmlComputeInstanceInfo_t *info)
{
    if (!info)
        return NVML_ERROR_INVALID_ARGUMENT;
    ciref c;
    nvmlReturn_t rc = ci_get(h, &c);
    if (rc != NVML_SUCCESS)
        return rc;
    const mock_ci_state *ci = &c.g.s->gi[c.g.gi].ci[c.ci];
    info->device = &g_dev_handles[c.g.gpu];
    info->gpuInstance = &g_gi_handles[c.g.gpu][c.g.gi];
    info->id = c.ci;
    info->profileId = ci->profile_id;
    info->placement.start = ci->start;
    info->placement.size = ci->size;
    return NVML_SUCCESS;
}
EXPORT nvmlReturn_t nvmlComputeInstanceGetInfo_v2(nvmlComputeInstance_t computeInstance,
                                                  nvmlComputeInstanceInfo_t *info)
{
    LOCKED(ci_info(computeInstance, info));
}
EXPORT nvmlReturn_t nvmlComputeInstanceGetInfo(nvmlComputeInstance_t computeInstance,
                                               nvmlComputeInstanceInfo_t *info)
{
    LOCKED(ci_info(computeInstance, info));
}

/* ---- MIG device handles ---- */
static nvmlReturn_t is_mig(nvmlDevice_t d, unsigned int *out)
{
    if (!out)
        return NVML_ERROR_INVALID_ARGUMENT;
    devref r;
    nvmlReturn_t rc = dev_get(d, &r, DEV_ALLOW_MIG | DEV_ALLOW_LOST);
    if (rc == NVML_SUCCESS)
        *out = (unsigned)r.mig;
    return rc;
}
EXPORT nvmlReturn_t nvmlDeviceIsMigDeviceHandle(nvmlDevice_t device, unsigned int *isMigDevice)
{
    LOCKED(is_mig(device, isMigDevice));
}

static nvmlReturn_t mig_ids(nvmlDevice_t d, unsigned int *id, int want_ci)
{
    if (!id)
        return NVML_ERROR_INVALID_ARGUMENT;
    devref r;
    nvmlReturn_t rc = dev_get(d, &r, DEV_ALLOW_MIG);
    if (rc != NVML_SUCCESS)
        return rc;
    if (!r.mig)
        return NVML_ERROR_INVALID_ARGUMENT; /* a full GPU's handle, as the driver answers */
    *id = want_ci ? r.ci : r.gi;
    return NVML_SUCCESS;
}
EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceId(nvmlDevice_t device, unsigned int *id) { LOCKED(mig_ids(device, id, 0)); }
EXPORT nvmlReturn_t nvmlDeviceGetComputeInstanceId(nvmlDevice_t device, unsigned int *id) { LOCKED(mig_ids(device, id, 1)); }

static nvmlReturn_t max_mig(nvmlDevice_t d, unsigned int *count)
{
    if (!count)
        return NVML_ERROR_INVALID_ARGUMENT;
    devref r;
    nvmlReturn_t rc = dev_get(d, &r, 0);
    if (rc == NVML_ERROR_NOT_SUPPORTED)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (rc != NVML_SUCCESS)
        return rc;
    *count = (r.p->mig && r.s->mig_current == NVML_DEVICE_MIG_ENABLE) ? r.p->mig->compute_slices : 0;
    return NVML_SUCCESS;
}
EXPORT nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t device, unsigned int *count)
{
    LOCKED(max_mig(device, count));
}

static nvmlReturn_t mig_by_index(nvmlDevice_t d, unsigned int index, nvmlDevice_t *out)
{
    if (!out)
        return NVML_ERROR_INVALID_ARGUMENT;
    devref r;
    nvmlReturn_t rc = mig_dev(d, &r, 0);
    if (rc != NVML_SUCCESS)
        return rc;
    if (index >= r.p->mig->compute_slices)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (r.s->mig_current != NVML_DEVICE_MIG_ENABLE)
        return NVML_ERROR_NOT_FOUND;
    unsigned k = 0;
    for (unsigned g = 0; g < MOCK_MAX_GI; g++)
        for (unsigned c = 0; r.s->gi[g].used && c < MOCK_MAX_CI; c++)
            if (r.s->gi[g].ci[c].used && k++ == index) {
                *out = &g_mig_handles[r.gpu][g][c];
                return NVML_SUCCESS;
            }
    return NVML_ERROR_NOT_FOUND;
}
EXPORT nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t device, unsigned int index,
                                                        nvmlDevice_t *migDevice)
{
    LOCKED(mig_by_index(device, index, migDevice));
}

static nvmlReturn_t parent_of(nvmlDevice_t mig, nvmlDevice_t *out)
{
    if (!out)
        return NVML_ERROR_INVALID_ARGUMENT;
    devref r;
    nvmlReturn_t rc = dev_get(mig, &r, DEV_ALLOW_MIG);
    if (rc != NVML_SUCCESS)
        return rc;
    if (!r.mig)
        return NVML_ERROR_INVALID_ARGUMENT;
    *out = &g_dev_handles[r.gpu];
    return NVML_SUCCESS;
}
EXPORT nvmlReturn_t nvmlDeviceGetDeviceHandleFromMigDeviceHandle(nvmlDevice_t migDevice, nvmlDevice_t *device)
{
    LOCKED(parent_of(migDevice, device));
}
