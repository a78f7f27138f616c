/* The driver face's refusals, on a machine without /dev/qcuda (guest-lib/tests/driver_face.rs):
 * versions and entry points answer without a device, cuInit reports the missing device, and
 * every unsupported entry point, unknown export table and unused table slot fails with a CUDA
 * error, saying so once on stderr. Prints one "name value" line per check. */
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

typedef int CUresult;
typedef struct { unsigned char bytes[16]; } CUuuid;
CUresult cuDriverGetVersion(int *);
CUresult cuInit(unsigned);
CUresult cuGetProcAddress_v2(const char *, void **, int, unsigned long long, int *);
CUresult cuGetExportTable(const void **, const CUuuid *);
CUresult cuGetErrorName(CUresult, const char **);
typedef int CUdevice;
CUresult cuDeviceGetLuid(char *, unsigned int *, CUdevice);

static CUuuid uuid(const char *hex) {
    CUuuid u;
    for (int i = 0; i < 16; i++) sscanf(hex + 2 * i, "%2hhx", &u.bytes[i]);
    return u;
}

int main(void) {
    int v = 0;
    CUresult r = cuDriverGetVersion(&v);
    printf("version %d %d\n", r, v);
    printf("init %d\n", cuInit(0));
    void *p = NULL;
    int st = -1;
    r = cuGetProcAddress_v2("cuMemAlloc", &p, 13000, 0, &st);
    printf("proc-memalloc %d %d %d\n", r, st, p == dlsym(RTLD_DEFAULT, "cuMemAlloc_v2"));
    r = cuGetProcAddress_v2("cuMemcpyHtoD", &p, 13000, 2, &st);
    printf("proc-ptds %d %d %d\n", r, st, p == dlsym(RTLD_DEFAULT, "cuMemcpyHtoD_v2_ptds"));
    r = cuGetProcAddress_v2("cuNoSuchFunction", &p, 13000, 0, &st);
    printf("proc-missing %d %d %d\n", r, st, p == NULL);
    r = cuGetProcAddress_v2("cuMemAlloc", &p, 1000, 0, &st);
    printf("proc-old %d %d %d\n", r, st, p == NULL);
    printf("proc-newer %d\n", cuGetProcAddress_v2("cuMemAlloc", &p, 99999, 0, &st));
    /* Windows only, refused on Linux natively too: not supported, said once. */
    char luid[8];
    unsigned int mask = 0;
    CUresult a1 = cuDeviceGetLuid(luid, &mask, 0);
    CUresult a2 = cuDeviceGetLuid(luid, &mask, 0);
    printf("luid %d %d\n", a1, a2);
    const void *t = NULL;
    CUuuid unknown = uuid("00112233445566778899aabbccddeeff");
    r = cuGetExportTable(&t, &unknown);
    printf("table-unknown %d %d\n", r, t == NULL);
    CUuuid ctx = uuid("21318c60971432488ca641ff7324c8f2");
    r = cuGetExportTable(&t, &ctx);
    const unsigned long long *words = t;
    CUresult (*slot20)(void) = (CUresult (*)(void))words[20];
    CUresult s1 = slot20(), s2 = slot20();
    printf("table-ctx %d %llu %d %d\n", r, words[0], s1, s2);
    const char *name = NULL;
    cuGetErrorName(100, &name);
    printf("name %s\n", name);
    return 0;
}
