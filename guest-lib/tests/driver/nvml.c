/* The NVML face (libnvidia-ml.so.1) on a machine without /dev/qcuda (guest-lib/tests/nvml_face.rs):
 * it is found by dlopen as NCCL and PyTorch look for it, nvmlInit_v2 reports the missing driver
 * as NVIDIA's does, device calls before a successful init answer "uninitialized", and a function
 * a VM cannot answer says so once. Prints one "name value" line per check. */
#include <dlfcn.h>
#include <stdio.h>

typedef unsigned (*init_fn)(void);
typedef const char *(*str_fn)(unsigned);
typedef unsigned (*count_fn)(unsigned *);
typedef unsigned (*link_fn)(void *, unsigned, unsigned *);

int main(void) {
    void *h = dlopen("libnvidia-ml.so.1", RTLD_NOW);
    printf("open %d\n", h != NULL);
    if (!h) return 1;
    init_fn init = (init_fn)dlsym(h, "nvmlInit_v2");
    str_fn err = (str_fn)dlsym(h, "nvmlErrorString");
    count_fn count = (count_fn)dlsym(h, "nvmlDeviceGetCount_v2");
    link_fn link = (link_fn)dlsym(h, "nvmlDeviceGetNvLinkState");
    unsigned r = init();
    printf("init %u %s\n", r, err(r));
    unsigned n = 7;
    printf("count %u %u\n", count(&n), n);
    unsigned a = 0;
    printf("nvlink %u %u\n", link(NULL, 0, &a), link(NULL, 0, &a));
    printf("missing %d\n", dlsym(h, "nvmlDeviceGetBAR1MemoryInfo") == NULL);
    return 0;
}
