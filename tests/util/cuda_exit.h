/*
 * cuda_exit.h - CK and EK for GPU tests and benchmarks that stop at the
 * first failed call: CK(cudaCall) and EK(epxCall) print the call, its line
 * and the error (EK: the message in the caller's `epx_error er`) and end
 * the program.
 */
#ifndef EPX_CUDA_EXIT_H
#define EPX_CUDA_EXIT_H
#include <stdio.h>
#include <stdlib.h>

#define CK(call)                                                                                   \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess) {                                                                   \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)
#define EK(call)                                                                                   \
    do {                                                                                           \
        epx_status s_ = (call);                                                                    \
        if (s_ != EPX_OK) {                                                                        \
            fprintf(stderr, "%s:%d: %s: %s (%s)\n", __FILE__, __LINE__, #call, epx_status_str(s_), \
                    er.msg);                                                                       \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

#endif /* EPX_CUDA_EXIT_H */
