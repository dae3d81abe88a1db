/*
 * gpukit mock NVML: library lifetime, configuration, system queries, error strings.
 */
#include "mock.h"

#include <dlfcn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mig_tables.h"

pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
unsigned g_refcount;
mock_profile g_prof;
mock_state g_state;
char g_state_dir[PATH_MAX];

static char g_last_error[1024];
static char g_override_profile[PATH_MAX];
static char g_override_state_dir[PATH_MAX];

void mock_set_error(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_last_error, sizeof g_last_error, fmt, ap);
    va_end(ap);
}

void mock_report_error(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_last_error, sizeof g_last_error, fmt, ap);
    va_end(ap);
    fprintf(stderr, "gpukit mock NVML: %s\n", g_last_error);
    fflush(stderr);
}

const char *mock_profile_path(void)
{
    if (g_override_profile[0])
        return g_override_profile;
    const char *e = getenv("GPUKIT_NVML_PROFILE");
    return (e && *e) ? e : MOCK_DEFAULT_PROFILE;
}

const char *mock_state_dir_path(void)
{
    if (g_override_state_dir[0])
        return g_override_state_dir;
    const char *e = getenv("GPUKIT_NVML_STATE_DIR");
    return (e && *e) ? e : MOCK_DEFAULT_STATE_DIR;
}

nvmlReturn_t mock_load_config(void)
{
    static mock_profile fresh; /* large: keep off the stack */
    nvmlReturn_t rc = profile_load(mock_profile_path(), &fresh);
    if (rc != NVML_SUCCESS)
        return rc;
    g_prof = fresh;
    snprintf(g_state_dir, sizeof g_state_dir, "%s", mock_state_dir_path());
    handles_init();
    return NVML_SUCCESS;
}

/* ---- MIG tables ---- */
const mock_mig_table *mock_mig_table_find(const char *key)
{
    for (unsigned i = 0; i < MOCK_MIG_TABLE_COUNT; i++)
        if (strcmp(MOCK_MIG_TABLES[i].key, key) == 0)
            return &MOCK_MIG_TABLES[i];
    return NULL;
}

const char *mock_mig_table_keys(void)
{
    static char buf[256];
    buf[0] = 0;
    for (unsigned i = 0; i < MOCK_MIG_TABLE_COUNT; i++) {
        if (i)
            strncat(buf, ", ", sizeof buf - strlen(buf) - 1);
        strncat(buf, MOCK_MIG_TABLES[i].key, sizeof buf - strlen(buf) - 1);
    }
    return buf;
}

const mock_gi_profile *mig_gi_profile(const mock_mig_table *t, unsigned profile_id)
{
    if (!t)
        return NULL;
    for (unsigned i = 0; i < t->ngi; i++)
        if (t->gi[i].profile_id == profile_id)
            return &t->gi[i];
    return NULL;
}

const mock_gi_profile *mig_gi_profile_by_driver_id(const mock_mig_table *t, unsigned driver_id)
{
    if (!t)
        return NULL;
    for (unsigned i = 0; i < t->ngi; i++)
        if (t->gi[i].driver_id == driver_id)
            return &t->gi[i];
    return NULL;
}

/* SMs of a compute instance: the GPU instance's all when it spans it (an H100's 7g.80gb has 132,
 * not 7 x 18), else its slices times the per-slice share (partial compute instances of a real
 * driver were not recorded; gpukit.contracts.mig_profiles computes the same). */
unsigned mig_ci_multiprocessors(const mock_gi_profile *g, const mock_ci_profile *c)
{
    if (c->slices >= g->compute_slices)
        return g->multiprocessors;
    return c->slices * (g->multiprocessors / g->compute_slices);
}

const mock_ci_profile *mig_ci_profile(const mock_gi_profile *g, unsigned ci_profile_id)
{
    for (unsigned i = 0; g && i < g->nci; i++)
        if (g->ci[i].profile_id == ci_profile_id)
            return &g->ci[i];
    return NULL;
}

/* ---- init / shutdown ---- */

/* The driver's user space is built for one kernel module version: the real library is installed
 * as libnvidia-ml.so.<version>, and its nvmlInit fails with LIB_RM_VERSION_MISMATCH while another
 * module is loaded (after a package upgrade, until the modules are reloaded or the node reboots).
 * The mock's "loaded module" is the profile's driver_version (the stand-in module's load writes
 * it); its own version is the one its file name carries, as the driver package installs it. A
 * library loaded under another name (a build tree, tests) has no version to compare. */
static nvmlReturn_t check_rm_version(void)
{
    Dl_info info;
    char real[PATH_MAX];
    if (!dladdr((void *)&check_rm_version, &info) || !info.dli_fname ||
        !realpath(info.dli_fname, real))
        return NVML_SUCCESS;
    const char *base = strrchr(real, '/');
    base = base ? base + 1 : real;
    static const char prefix[] = "libnvidia-ml.so.";
    if (strncmp(base, prefix, sizeof prefix - 1) != 0)
        return NVML_SUCCESS;
    const char *lib = base + sizeof prefix - 1;
    if (!strchr(lib, '.') || strcmp(lib, g_prof.driver_version) == 0)
        return NVML_SUCCESS;
    mock_set_error("API mismatch: the NVIDIA kernel module has version %s, but this NVIDIA "
                      "driver component (%s) has version %s",
                      g_prof.driver_version, base, lib);
    return NVML_ERROR_LIB_RM_VERSION_MISMATCH;
}

static nvmlReturn_t init_impl(unsigned int flags)
{
    (void)flags;
    pthread_mutex_lock(&g_mu);
    nvmlReturn_t rc = NVML_SUCCESS;
    if (g_refcount == 0) {
        rc = mock_load_config();
        if (rc == NVML_SUCCESS)
            rc = check_rm_version();
        if (rc == NVML_SUCCESS)
            rc = state_refresh();
    }
    if (rc == NVML_SUCCESS)
        g_refcount++;
    pthread_mutex_unlock(&g_mu);
    return rc;
}

EXPORT nvmlReturn_t nvmlInitWithFlags(unsigned int flags) { return init_impl(flags); }
EXPORT nvmlReturn_t nvmlInit_v2(void) { return init_impl(0); }
EXPORT nvmlReturn_t nvmlInit(void) { return init_impl(0); }

EXPORT nvmlReturn_t nvmlShutdown(void)
{
    pthread_mutex_lock(&g_mu);
    nvmlReturn_t rc = NVML_SUCCESS;
    if (g_refcount == 0)
        rc = NVML_ERROR_UNINITIALIZED;
    else
        g_refcount--;
    pthread_mutex_unlock(&g_mu);
    return rc;
}

/* ---- error strings, as the real library words them ---- */
EXPORT const char *nvmlErrorString(nvmlReturn_t result)
{
    switch (result) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_NO_PERMISSION: return "Insufficient Permissions";
    case NVML_ERROR_ALREADY_INITIALIZED: return "Already Initialized";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_INSUFFICIENT_POWER: return "Insufficient External Power";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    case NVML_ERROR_TIMEOUT: return "Timeout";
    case NVML_ERROR_IRQ_ISSUE: return "Interrupt request issue";
    case NVML_ERROR_LIBRARY_NOT_FOUND: return "NVML Shared Library Not Found";
    case NVML_ERROR_FUNCTION_NOT_FOUND: return "Function Not Found";
    case NVML_ERROR_CORRUPTED_INFOROM: return "Corrupted infoROM";
    case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
    case NVML_ERROR_RESET_REQUIRED: return "GPU requires restart";
    case NVML_ERROR_OPERATING_SYSTEM: return "The operating system has blocked the request.";
    case NVML_ERROR_LIB_RM_VERSION_MISMATCH: return "RM has detected an NVML/RM version mismatch.";
    case NVML_ERROR_IN_USE: return "In use by another client";
    case NVML_ERROR_MEMORY: return "Insufficient Memory";
    case NVML_ERROR_NO_DATA: return "No data";
    case NVML_ERROR_VGPU_ECC_NOT_SUPPORTED:
        return "The requested vgpu operation is not available on target device, because ECC is "
               "enabled";
    case NVML_ERROR_INSUFFICIENT_RESOURCES: return "Insufficient resources";
    case NVML_ERROR_FREQ_NOT_SUPPORTED: return "Frequency not supported";
    case NVML_ERROR_ARGUMENT_VERSION_MISMATCH: return "Argument version mismatch";
    case NVML_ERROR_DEPRECATED: return "Deprecated";
    case NVML_ERROR_NOT_READY: return "Not Ready";
    case NVML_ERROR_GPU_NOT_FOUND: return "GPU not found";
    case NVML_ERROR_INVALID_STATE: return "Invalid state";
    case NVML_ERROR_RESET_TYPE_NOT_SUPPORTED: return "Reset type not supported";
    case NVML_ERROR_UNKNOWN: return "Unknown Error";
    default: return "Unknown Error";
    }
}

/* ---- system queries ---- */
nvmlReturn_t copy_str(char *dst, unsigned int len, const char *src)
{
    if (!dst)
        return NVML_ERROR_INVALID_ARGUMENT;
    size_t n = strlen(src);
    if (len < n + 1)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(dst, src, n + 1);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length)
{
    LOCKED(copy_str(version, length, g_prof.driver_version));
}

EXPORT nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length)
{
    LOCKED(copy_str(version, length, g_prof.nvml_version));
}

static nvmlReturn_t cuda_version(int *v)
{
    if (!v)
        return NVML_ERROR_INVALID_ARGUMENT;
    *v = g_prof.cuda_version;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *cudaDriverVersion)
{
    LOCKED(cuda_version(cudaDriverVersion));
}

EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *cudaDriverVersion)
{
    LOCKED(cuda_version(cudaDriverVersion));
}

static nvmlReturn_t process_name(unsigned int pid, char *name, unsigned int length)
{
    if (!name || length == 0)
        return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t rc = state_refresh();
    if (rc != NVML_SUCCESS)
        return rc;
    for (unsigned g = 0; g < g_prof.ngpu; g++)
        for (unsigned i = 0; i < g_state.gpu[g].nproc; i++)
            if (g_state.gpu[g].proc[i].pid == pid && g_state.gpu[g].proc[i].name[0]) {
                snprintf(name, length, "%s", g_state.gpu[g].proc[i].name);
                return NVML_SUCCESS;
            }
    char path[64], buf[256];
    snprintf(path, sizeof path, "/proc/%u/comm", pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return NVML_ERROR_NOT_FOUND;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    buf[strcspn(buf, "\n")] = 0;
    snprintf(name, length, "%s", buf);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlSystemGetProcessName(unsigned int pid, char *name, unsigned int length)
{
    LOCKED(process_name(pid, name, length));
}

/* ---- gpukit control entry points (not part of NVML; used by python -m gpukit.lab.nvml) ---- */
EXPORT const char *gpukitMockLastError(void) { return g_last_error; }

EXPORT const char *gpukitMockVersion(void) { return "gpukit-mock-nvml 1"; }

EXPORT nvmlReturn_t gpukitMockConfigure(const char *profile_path, const char *state_dir)
{
    pthread_mutex_lock(&g_mu);
    nvmlReturn_t rc = NVML_SUCCESS;
    if (g_refcount) {
        rc = NVML_ERROR_IN_USE;
    } else {
        snprintf(g_override_profile, sizeof g_override_profile, "%s", profile_path ? profile_path : "");
        snprintf(g_override_state_dir, sizeof g_override_state_dir, "%s", state_dir ? state_dir : "");
    }
    pthread_mutex_unlock(&g_mu);
    return rc;
}
