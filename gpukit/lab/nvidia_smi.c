/* nvidia-smi of the gpukit lab's stand-in driver, as a binary like the driver's: it loads
 * libnvidia-ml.so.1 by soname (dlopen through the loader's cache and default paths), so it runs
 * wherever the driver's nvidia-smi runs, a container given the driver's files by a CDI spec or
 * the runtime included (no Python there). `-L` / `--list-gpus` is answered here, in
 * nvidia-smi's format (gpukit/lab/nvidia_smi.py prints the same); any other command line is
 * handed to gpukit/lab/nvidia_smi.py with the node's python3 (the script at
 * <this binary's dir>/../lib/nvidia/lab, so it also runs from a mounted driver root, else at
 * LAB_DIR). Exit status: 0, or NVML's error code, as nvidia-smi.
 */
#include <dlfcn.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifndef LAB_DIR
#define LAB_DIR "/usr/lib/nvidia/lab"
#endif
#define NVML_SUCCESS 0
#define NVML_ERROR_DRIVER_NOT_LOADED 9
#define NVML_ERROR_LIBRARY_NOT_FOUND 12
#define NVML_DEVICE_MIG_ENABLE 1

typedef int ret_t;
typedef void *nvml_dev;
static ret_t (*init)(void);
static ret_t (*shutdown_)(void);
static ret_t (*count)(unsigned *);
static ret_t (*by_index)(unsigned, nvml_dev *);
static ret_t (*name)(nvml_dev, char *, unsigned);
static ret_t (*uuid)(nvml_dev, char *, unsigned);
static ret_t (*mig_mode)(nvml_dev, unsigned *, unsigned *);
static ret_t (*mig_count)(nvml_dev, unsigned *);
static ret_t (*mig_by_index)(nvml_dev, unsigned, nvml_dev *);
static const char *(*error_string)(ret_t);

static int python_rest(char **argv) {
    char self[PATH_MAX], script[PATH_MAX + 64];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    const char *dir = "/usr/bin";
    if (n > 0) {
        self[n] = 0;
        char *slash = strrchr(self, '/');
        if (slash) {
            *slash = 0;
            dir = self;
        }
    }
    snprintf(script, sizeof script, "%s/../lib/nvidia/lab/nvidia_smi.py", dir);
    if (access(script, R_OK) != 0)
        snprintf(script, sizeof script, "%s/nvidia_smi.py", LAB_DIR);
    int argc = 0;
    while (argv[argc])
        argc++;
    char **args = calloc((size_t)argc + 2, sizeof *args);
    if (!args)
        return 1;
    args[0] = "python3";
    args[1] = script;
    for (int i = 1; i < argc; i++)
        args[i + 1] = argv[i];
    execv("/usr/bin/python3", args);
    fprintf(stderr, "nvidia-smi (gpukit lab): only -L works without /usr/bin/python3 here\n");
    return 1;
}

static void *sym(void *lib, const char *fn) {
    void *p = dlsym(lib, fn);
    if (!p) {
        fprintf(stderr, "nvidia-smi: libnvidia-ml.so.1 has no %s\n", fn);
        exit(NVML_ERROR_LIBRARY_NOT_FOUND);
    }
    return p;
}

static int list_gpus(void) {
    void *lib = dlopen("libnvidia-ml.so.1", RTLD_NOW);
    if (!lib) {
        printf("NVIDIA-SMI couldn't find libnvidia-ml.so library in your system. Please make "
               "sure that the NVIDIA Display Driver is properly installed and present in your "
               "system.\nPlease also try adding directory that contains libnvidia-ml.so to your "
               "system PATH.\n");
        return NVML_ERROR_LIBRARY_NOT_FOUND;
    }
    init = (ret_t(*)(void))sym(lib, "nvmlInit_v2");
    shutdown_ = (ret_t(*)(void))sym(lib, "nvmlShutdown");
    count = (ret_t(*)(unsigned *))sym(lib, "nvmlDeviceGetCount_v2");
    by_index = (ret_t(*)(unsigned, nvml_dev *))sym(lib, "nvmlDeviceGetHandleByIndex_v2");
    name = (ret_t(*)(nvml_dev, char *, unsigned))sym(lib, "nvmlDeviceGetName");
    uuid = (ret_t(*)(nvml_dev, char *, unsigned))sym(lib, "nvmlDeviceGetUUID");
    mig_mode = (ret_t(*)(nvml_dev, unsigned *, unsigned *))sym(lib, "nvmlDeviceGetMigMode");
    mig_count = (ret_t(*)(nvml_dev, unsigned *))sym(lib, "nvmlDeviceGetMaxMigDeviceCount");
    mig_by_index = (ret_t(*)(nvml_dev, unsigned, nvml_dev *))sym(lib,
                                                             "nvmlDeviceGetMigDeviceHandleByIndex");
    error_string = (const char *(*)(ret_t))sym(lib, "nvmlErrorString");
    ret_t rc = init();
    if (rc != NVML_SUCCESS) {
        if (rc == NVML_ERROR_DRIVER_NOT_LOADED)
            printf("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA "
                   "driver. Make sure that the latest NVIDIA driver is installed and running.\n");
        else
            printf("Failed to initialize NVML: %s\n", error_string(rc));
        return rc;
    }
    unsigned n = 0;
    int status = count(&n);
    for (unsigned i = 0; status == NVML_SUCCESS && i < n; i++) {
        nvml_dev h;
        char nm[96], id[96];
        rc = by_index(i, &h);
        if (rc == NVML_SUCCESS)
            rc = name(h, nm, sizeof nm);
        if (rc == NVML_SUCCESS)
            rc = uuid(h, id, sizeof id);
        if (rc != NVML_SUCCESS) {
            printf("GPU %u: %s\n", i, error_string(rc));
            status = rc;
            continue;
        }
        printf("GPU %u: %s (UUID: %s)\n", i, nm, id);
        unsigned current = 0, pending = 0, max = 0, k = 0;
        if (mig_mode(h, &current, &pending) != NVML_SUCCESS || current != NVML_DEVICE_MIG_ENABLE
            || mig_count(h, &max) != NVML_SUCCESS)
            continue;
        for (unsigned m = 0; m < max; m++) {
            nvml_dev mh;
            if (mig_by_index(h, m, &mh) != NVML_SUCCESS || name(mh, nm, sizeof nm) != NVML_SUCCESS
                || uuid(mh, id, sizeof id) != NVML_SUCCESS)
                continue;
            /* NVML names a MIG device "<GPU name> MIG <profile>"; nvidia-smi shows the profile. */
            const char *profile = strstr(nm, " MIG ");
            printf("  MIG %-11s Device %2u: (UUID: %s)\n", profile ? profile + 5 : nm, k++, id);
        }
    }
    shutdown_();
    return status;
}

int main(int argc, char **argv) {
    if (argc == 2 && (!strcmp(argv[1], "-L") || !strcmp(argv[1], "--list-gpus")))
        return list_gpus();
    return python_rest(argv);
}
