// SPDX-License-Identifier: Apache-2.0 OR MIT
// A test double of NVIDIA's driver libraries (libcuda.so.1, libnvidia-ml.so.1) for the chrooted
// guest's test (scripts/test.sh, share-chroot): built by ./run, laid where NVIDIA's driver
// installs itself, so that the guest must show that no name or path reaches it. It answers like
// a driver that sees no GPU, and exports a marker that qcuda's libraries do not have.
int qcuda_test_double_nvidia_driver = 1;

int cuInit(unsigned flags) {
    (void)flags;
    return 100; /* CUDA_ERROR_NO_DEVICE */
}

int cuDriverGetVersion(int *version) {
    if (version)
        *version = 13000;
    return 0;
}

int nvmlInit_v2(void) {
    return 9; /* NVML_ERROR_DRIVER_NOT_LOADED */
}
