/* The lab's CUDA-like workload: loads the driver's libcuda.so.1 the way the CUDA runtime
 * does (dlopen by soname, so through the dynamic loader's cache and default paths: what the
 * runtime or CDI mounted into the container), initialises it and prints what it found:
 *
 *   CUDA_NODES=<its nvidia device nodes, caps included>   CUDA_LOAD=ok|<dlerror>
 *   CUDA_INIT=<CUresult>   CUDA_DRIVER=<version>   CUDA_DEVICES=<n>
 *
 * Exit status: 0 with at least one device, 2 when the library cannot be loaded, 3 when it
 * has no such entry point, 4 when cuInit fails. Then it stays up for SLEEP seconds (argv[1],
 * default 0) so a test can look at the container.
 */
#include <dirent.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef int (*init_fn)(unsigned int);
typedef int (*int_out_fn)(int *);

static void linger(int argc, char **argv) {
    fflush(stdout);
    if (argc > 1)
        sleep((unsigned)atoi(argv[1]));
}

static void print_nodes(const char *dir, const char *prefix) {
    DIR *d = opendir(dir);
    if (!d)
        return;
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        if (strncmp(e->d_name, prefix, strlen(prefix)) == 0 && e->d_type != DT_DIR)
            printf(" %s/%s", dir, e->d_name);
    closedir(d);
}

int main(int argc, char **argv) {
    printf("CUDA_NODES=");
    print_nodes("/dev", "nvidia");
    print_nodes("/dev/nvidia-caps", "nvidia-cap");
    printf("\n");
    void *lib = dlopen("libcuda.so.1", RTLD_NOW);
    if (!lib) {
        printf("CUDA_LOAD=%s\n", dlerror());
        linger(argc, argv);
        return 2;
    }
    printf("CUDA_LOAD=ok\n");
    init_fn init = (init_fn)dlsym(lib, "cuInit");
    int_out_fn driver = (int_out_fn)dlsym(lib, "cuDriverGetVersion");
    int_out_fn count = (int_out_fn)dlsym(lib, "cuDeviceGetCount");
    if (!init || !driver || !count) {
        printf("CUDA_SYMBOLS=missing\n");
        linger(argc, argv);
        return 3;
    }
    int version = 0, n = 0;
    int rc = init(0);
    printf("CUDA_INIT=%d\n", rc);
    if (driver(&version) == 0)
        printf("CUDA_DRIVER=%d\n", version);
    if (rc == 0 && count(&n) == 0)
        printf("CUDA_DEVICES=%d\n", n);
    linger(argc, argv);
    return rc == 0 ? 0 : 4;
}
