// A host program of the pre-copy hash's mixers and terms, compiled by nvcc from the very
// functions the kernel runs (precopy_hash.cu, without its kernel), for precopy.rs's test that
// the Rust reference computes the same without a GPU. It prints, one per line in hex:
// mix0(x) and mix1(x) for each x below, then the two lanes of the hash of each test buffer
// (byte j of buffer n = (j * 131 + n * 7 + 1) & 0xff, lengths below), computed word by word
// with qcuda_add_word and qcuda_add_length.
//   root=$(scripts/cuda-toolchain.sh)
//   $root/bin/nvcc -o check precopy_mixer_check.cu && ./check
#define QCUDA_PRECOPY_MIXERS_ONLY
#include "precopy_hash.cu"

#include <stdio.h>
#include <string.h>

static const u64 inputs[] = {0, 1, 2, 0x8000000000000000ULL, 0xffffffffffffffffULL,
                             0x0123456789abcdefULL, QCUDA_K0, QCUDA_L1};
static const u64 lengths[] = {0, 1, 7, 8, 9, 4096, 2097152 - 3};

int main(void)
{
    for (unsigned i = 0; i < sizeof inputs / sizeof inputs[0]; i++)
        printf("%016llx %016llx\n", qcuda_mix0(inputs[i]), qcuda_mix1(inputs[i]));
    static unsigned char buf[2097152];
    for (unsigned n = 0; n < sizeof lengths / sizeof lengths[0]; n++) {
        u64 len = lengths[n], h0 = 0, h1 = 0;
        for (u64 j = 0; j < len; j++)
            buf[j] = (unsigned char)((j * 131 + n * 7 + 1) & 0xff);
        for (u64 w = 0; w * 8 < len; w++) {
            u64 x = 0;
            for (u64 b = 0; b < 8 && w * 8 + b < len; b++)
                x |= (u64)buf[w * 8 + b] << (8 * b);
            qcuda_add_word(x, w, &h0, &h1);
        }
        qcuda_add_length(len, &h0, &h1);
        printf("%016llx %016llx\n", h0, h1);
    }
    return 0;
}
