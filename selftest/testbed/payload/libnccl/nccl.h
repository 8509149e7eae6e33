/*
 * nccl.h of the gpuhealth test bed's libnccl-dev stand-in.
 *
 * The version macros, the result codes and the one call the stand-in libnccl.so.2
 * implements, under NCCL's names and values, so that a program built against it (the
 * nccl-tests stand-in) compiles, links and loads the way it would against NVIDIA's NCCL.
 * There is no communicator and no collective: nothing on the bed moves data between GPUs.
 * The version must match the package's (standins.NCCL_VERSION; a selftest compares them).
 */
#ifndef NCCL_H_
#define NCCL_H_

#define NCCL_MAJOR 2
#define NCCL_MINOR 25
#define NCCL_PATCH 1
#define NCCL_SUFFIX ""
/* Since NCCL 2.9 a version is MAJOR * 10000 + MINOR * 100 + PATCH. */
#define NCCL_VERSION(X, Y, Z) \
    (((X) == 2 && (Y) <= 8) ? (X) * 1000 + (Y) * 100 + (Z) : (X) * 10000 + (Y) * 100 + (Z))
#define NCCL_VERSION_CODE NCCL_VERSION(NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH)

typedef enum {
    ncclSuccess = 0,
    ncclUnhandledCudaError = 1,
    ncclSystemError = 2,
    ncclInternalError = 3,
    ncclInvalidArgument = 4,
    ncclInvalidUsage = 5,
    ncclRemoteError = 6,
    ncclInProgress = 7,
    ncclNumResults = 8
} ncclResult_t;

#ifdef __cplusplus
extern "C" {
#endif

/* The NCCL_VERSION_CODE of the library that is loaded (not of the header compiled against). */
ncclResult_t ncclGetVersion(int *version);

#ifdef __cplusplus
}
#endif

#endif /* NCCL_H_ */
