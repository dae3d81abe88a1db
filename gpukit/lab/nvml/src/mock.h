/*
 * gpukit mock NVML: internal declarations.
 *
 * The library is compiled against the real nvml.h (nvidia-nvml-dev) with
 * NVML_NO_UNVERSIONED_FUNC_DEFS, so both the versioned (_v2, _v3) and the old unversioned entry
 * points are declared and implemented. Everything is hidden except nvml* and gpukitMock* symbols.
 */
#ifndef GPUKIT_MOCK_H
#define GPUKIT_MOCK_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include <limits.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "nvml.h"

#define EXPORT __attribute__((visibility("default")))

#define MOCK_MAX_GPUS 64
#define MOCK_MAX_GI 15 /* GPU instance ids 0..14 */
#define MOCK_MAX_CI 8  /* compute instance ids 0..7 per GPU instance */
#define MOCK_MAX_PROCS 32
#define MOCK_MAX_NUMA 16
#define MOCK_MAX_CPUS 1024
#define MOCK_CPU_WORDS (MOCK_MAX_CPUS / (8 * sizeof(unsigned long)))
#define MOCK_MAX_NVLINK_PEERS 8
#define MOCK_MAX_NVSWITCHES 16
#define MOCK_NO_ID 0xFFFFFFFFu

/* /dev/nvidia-caps minors, the driver's fixed table (/proc/driver/nvidia-caps/mig-minors):
 * config 1, monitor 2, then per GPU minor 15 GPU instances of (access, 8 compute instances). */
#define MOCK_CAPS_CONFIG_MINOR 1u
#define MOCK_CAPS_MONITOR_MINOR 2u
#define MOCK_CAPS_FIRST_GPU_MINOR 3u
#define MOCK_CAPS_PER_GI (1u + MOCK_MAX_CI)
#define MOCK_CAPS_PER_GPU (MOCK_MAX_GI * MOCK_CAPS_PER_GI)
#define MOCK_CAPS_TABLE_GPUS 32u /* mig-minors lists GPU minors 0..31 (more if a node has more) */
/* The rest of the stand-in driver's /proc/driver (gpukit.lab.driver_surface renders the same). */
#define MOCK_IRQ_BASE 120u /* IRQ of GPU 0 in gpus/<bus id>/information; GPU i: + i */
#define MOCK_DRIVER_BUILD_DATE "Tue Jan  6 00:00:00 UTC 2026"
#define MOCK_DRIVER_GCC "gcc version 12.2.0 (Debian 12.2.0-14)"

#define MOCK_DEFAULT_PROFILE "/etc/gpukit-lab/nvml/profile.yaml"
#define MOCK_DEFAULT_STATE_DIR "/var/lib/gpukit-lab/nvml"

/* ---- MIG tables (data generated from gpukit/contracts/mig_profiles.yaml) ---- */
typedef struct {
    unsigned copy, decoder, encoder, jpeg, ofa;
} mock_engines;

typedef struct {
    unsigned profile_id, slices, max_count, nplacements;
    unsigned placements[8];
} mock_ci_profile;

/* A GPU-instance profile: profile_id is the NVML_GPU_INSTANCE_PROFILE_* constant (what
 * nvmlDeviceGetGpuInstanceProfileInfo(V) takes, and what the state file records), driver_id the
 * driver's id for it (the profile info's id, nvmlGpuInstanceInfo_t.profileId, and what every call
 * taking a profileId takes). */
typedef struct {
    const char *name;
    unsigned profile_id, driver_id, compute_slices, memory_slices, multiprocessors;
    unsigned long long memory_mb;
    unsigned max_count, nplacements;
    unsigned placements[8];
    mock_engines engines;
    unsigned p2p;
    unsigned nci;
    mock_ci_profile ci[8];
} mock_gi_profile;

typedef struct {
    const char *key;
    unsigned memory_slices, compute_slices, multiprocessors;
    mock_engines engines;
    unsigned ngi;
    mock_gi_profile gi[NVML_GPU_INSTANCE_PROFILE_COUNT];
} mock_mig_table;

const mock_mig_table *mock_mig_table_find(const char *key);
const char *mock_mig_table_keys(void);
const mock_gi_profile *mig_gi_profile(const mock_mig_table *t, unsigned profile_id);
const mock_gi_profile *mig_gi_profile_by_driver_id(const mock_mig_table *t, unsigned driver_id);
unsigned mig_ci_multiprocessors(const mock_gi_profile *g, const mock_ci_profile *c);
const mock_ci_profile *mig_ci_profile(const mock_gi_profile *g, unsigned ci_profile_id);

/* ---- the node's GPU profile (read from YAML at nvmlInit) ---- */
typedef struct {
    char name[NVML_DEVICE_NAME_V2_BUFFER_SIZE];
    char uuid[NVML_DEVICE_UUID_V2_BUFFER_SIZE];
    char serial[NVML_DEVICE_SERIAL_BUFFER_SIZE];
    char pci_bus_id[NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE];
    char vbios[NVML_DEVICE_NAME_BUFFER_SIZE];
    char part_number[NVML_DEVICE_NAME_BUFFER_SIZE];
    unsigned domain, bus, device;
    unsigned pci_device_id, pci_subsystem_id;
    unsigned long long memory_mib, memory_reserved_mib;
    unsigned cc_major, cc_minor, arch, brand, multiprocessors;
    int numa_node;   /* -1: none */
    int pcie_switch; /* -1: own switch */
    unsigned minor;
    const mock_mig_table *mig; /* NULL: not MIG capable */
    int mig_enabled;           /* MIG mode at first boot */
    int mig_immediate;         /* mode change applies without a reset */
    /* nvlink_version: what nvmlDeviceGetNvLinkVersion answers, an nvmlNvlinkVersion_t
     * (NVML_NVLINK_VERSION_4_0 = 6 for NVLink 4.0), not the generation number */
    unsigned nvlink_version, nvlink_links, n_nvlink_peers;
    int nvlink_peers[MOCK_MAX_NVLINK_PEERS];
    /* NVSwitch wiring (exclusive with nvlink_peers): link i goes to switch
     * nvlink_switches[i % n_nvlink_switches], an index into mock_profile.nvswitch */
    unsigned n_nvlink_switches;
    int nvlink_switches[NVML_NVLINK_MAX_LINKS];
    /* idle figures (the profile's); telemetry.c moves them with the work on the GPU */
    unsigned power_usage_mw, power_limit_mw, temperature_c, util_gpu, util_mem;
    unsigned sm_clock_max_mhz, sm_clock_idle_mhz, mem_clock_mhz; /* 0: the architecture's */
    int persistence;
    unsigned pcie_gen, pcie_width;
    /* NVLink fabric (nvmlDeviceGetGpuFabricInfo, ...InfoV, ..._v4); has_fabric 0: the GPU has
     * none and those calls answer NVML_ERROR_NOT_SUPPORTED */
    int has_fabric;
    unsigned char fabric_cluster_uuid[NVML_GPU_FABRIC_UUID_LEN];
    unsigned fabric_clique_id, fabric_state, fabric_status, fabric_health_mask;
    unsigned fabric_health_summary;
} mock_gpu;

typedef struct {
    int id;
    unsigned long cpus[MOCK_CPU_WORDS];
} mock_numa;

/* An NVSwitch of the node's baseboard: a PCI device (class bridge) at the far end of GPU links;
 * NVML shows it only through nvmlDeviceGetNvLinkRemotePciInfo / ...RemoteDeviceType. */
typedef struct {
    char pci_bus_id[NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE];
    unsigned domain, bus, device;
    unsigned pci_device_id, pci_subsystem_id;
} mock_nvswitch;

typedef struct {
    char path[PATH_MAX];
    char name[128];
    char seed[128];
    char driver_version[NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE];
    char nvml_version[NVML_SYSTEM_NVML_VERSION_BUFFER_SIZE];
    int cuda_version;
    unsigned ngpu;
    mock_gpu gpu[MOCK_MAX_GPUS];
    unsigned nnuma;
    mock_numa numa[MOCK_MAX_NUMA];
    unsigned nswitch;
    mock_nvswitch nvswitch[MOCK_MAX_NVSWITCHES];
} mock_profile;

/* ---- persistent device state (state file in the state dir) ---- */
typedef struct {
    int used;
    unsigned profile_id, start, size;
    char uuid[NVML_DEVICE_UUID_V2_BUFFER_SIZE];
} mock_ci_state;

typedef struct {
    int used;
    unsigned profile_id, start, size;
    mock_ci_state ci[MOCK_MAX_CI];
} mock_gi_state;

typedef struct {
    unsigned pid;
    unsigned long long used_bytes;
    unsigned gi, ci; /* MOCK_NO_ID when not in a MIG instance */
    char name[64];
    unsigned util;                /* % of its GPU (or MIG instance) it keeps busy */
    unsigned long long since_ns;  /* CLOCK_REALTIME when it started (its energy so far) */
} mock_proc;

/* How event sets watching a GPU wait (a fault a test or the lab turns on; 0 = a sane driver). */
enum {
    MOCK_EVENTS_NORMAL = 0,
    MOCK_EVENTS_TIMEOUT = 1,  /* nvmlEventSetWait returns NVML_ERROR_TIMEOUT at once */
    MOCK_EVENTS_SPURIOUS = 2, /* ... returns at once with an event nobody asked for (PState) */
    MOCK_EVENTS_MODES
};

typedef struct {
    unsigned mig_current, mig_pending;
    unsigned compute_mode; /* nvmlComputeMode_t: set by nvmlDeviceSetComputeMode, kept per node */
    int lost;
    unsigned events; /* MOCK_EVENTS_* */
    unsigned long long mig_counter; /* bumps per compute instance created: MIG UUID material */
    mock_gi_state gi[MOCK_MAX_GI];
    unsigned nproc;
    mock_proc proc[MOCK_MAX_PROCS];
    /* telemetry counters: energy of work that ended (mJ above idle), ECC errors injected
     * (volatile: since the last reset or boot; aggregate: ever), a row remap waiting for a reset */
    unsigned long long energy_mj, sbe_vol, dbe_vol, sbe_agg, dbe_agg;
    unsigned remap_pending;
} mock_gpu_state;

typedef struct {
    unsigned long long serial;
    unsigned long long boot_ns; /* CLOCK_REALTIME of the last boot (0: the host's) */
    mock_gpu_state gpu[MOCK_MAX_GPUS];
} mock_state;

/* ---- opaque handle types of nvml.h ---- */
enum { HANDLE_GPU = 0x47505531u, HANDLE_MIG = 0x4d494731u };
struct nvmlDevice_st {
    unsigned kind, gpu, gi, ci;
};
struct nvmlGpuInstance_st {
    unsigned gpu, gi;
};
struct nvmlComputeInstance_st {
    unsigned gpu, gi, ci;
};

/* ---- globals (mock.c) ---- */
extern pthread_mutex_t g_mu;
extern unsigned g_refcount;
extern mock_profile g_prof;
extern mock_state g_state;
extern char g_state_dir[PATH_MAX];
extern struct nvmlDevice_st g_dev_handles[MOCK_MAX_GPUS];
extern struct nvmlDevice_st g_mig_handles[MOCK_MAX_GPUS][MOCK_MAX_GI][MOCK_MAX_CI];
extern struct nvmlGpuInstance_st g_gi_handles[MOCK_MAX_GPUS][MOCK_MAX_GI];
extern struct nvmlComputeInstance_st g_ci_handles[MOCK_MAX_GPUS][MOCK_MAX_GI][MOCK_MAX_CI];

void mock_set_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void mock_report_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
nvmlReturn_t mock_load_config(void); /* profile + state dir from overrides/env/defaults */
const char *mock_profile_path(void);
const char *mock_state_dir_path(void);

/* profile.c */
nvmlReturn_t profile_load(const char *path, mock_profile *out);
void mock_uuid(char *out, size_t n, const char *prefix, const char *material);

/* state.c */
nvmlReturn_t state_refresh(void);
nvmlReturn_t state_lock(int *fd);
nvmlReturn_t state_commit(int fd);
void state_unlock(int fd);
void state_defaults(mock_state *s);
unsigned mock_gi_count(const mock_gpu_state *gs);
int mock_gpu_busy(const mock_gpu_state *gs);
void mock_apply_reset(unsigned gpu);
nvmlReturn_t events_append(const char *line);
void events_truncate(void);
nvmlReturn_t mock_emit(const char *kind, unsigned gpu, unsigned long long type,
                       unsigned long long edata, unsigned gi, unsigned ci);
unsigned long long mock_supported_events(void);
extern const char *const mock_events_modes[MOCK_EVENTS_MODES]; /* names in state and status */
char *mock_status_json(size_t *len); /* malloc'd */

/* caps.c: the MIG capability files ($STATE_DIR/proc-driver/nvidia/capabilities) */
unsigned mock_caps_minor(unsigned gpu_minor, unsigned gi, unsigned ci); /* ci MOCK_NO_ID: gi */
nvmlReturn_t caps_render(void); /* rebuild from g_state; call with the state lock held */
nvmlReturn_t caps_repair(void);
nvmlReturn_t caps_render_static(void); /* version, gpus/<bus id>/information, mig-minors */ /* caps_render unless the tree already shows g_state.serial */

/* telemetry.c: what the GPU is doing, from the processes on it (state records and the lab
 * workload's client files, $STATE_DIR/clients/) */
#define MOCK_MAX_WORK (2 * MOCK_MAX_PROCS)
typedef struct {
    unsigned pid;
    unsigned long long used_bytes;
    unsigned gi, ci, util;
    int mps; /* an MPS client (listed by nvmlDeviceGetMPSComputeRunningProcesses_v3 only) */
} mock_work;
unsigned mock_work_of(unsigned gpu, mock_work *out, unsigned max); /* state + live clients */
int mock_gpu_busy_index(unsigned gpu);
unsigned long long mock_now_ns(void);
unsigned long long mock_proc_energy_mj(unsigned gpu, const mock_proc *p, unsigned long long now);
void mock_fold_proc_energy(unsigned gpu, const mock_proc *p); /* call before a proc goes */
void mock_fold_dead_clients(void);     /* state_commit: ended clients' energy into the state */
void mock_unlink_folded_clients(void); /* ... and their files gone once it landed */
void mock_clients_clear(void);     /* boot */

/* device.c: handle decoding */
typedef struct {
    unsigned gpu;
    int mig;
    unsigned gi, ci;
    const mock_gpu *p;
    mock_gpu_state *s;
} devref;
enum { DEV_ALLOW_MIG = 1, DEV_ALLOW_LOST = 2 };
nvmlReturn_t dev_get(nvmlDevice_t d, devref *out, int flags);
void handles_init(void);
nvmlReturn_t copy_str(char *dst, unsigned int len, const char *src);

/* Run an implementation under the library lock, refusing when not initialised. */
#define LOCKED(expr)                                                                               \
    do {                                                                                           \
        pthread_mutex_lock(&g_mu);                                                                 \
        nvmlReturn_t r_ = g_refcount ? (expr) : NVML_ERROR_UNINITIALIZED;                          \
        pthread_mutex_unlock(&g_mu);                                                               \
        return r_;                                                                                 \
    } while (0)

#endif
