/*
 * libnccl.so.2 of the gpuhealth test bed's libnccl2 stand-in: the call nccl.h declares.
 * Built on the controller with -shared -Wl,-soname,libnccl.so.2 (standins.py).
 */
#include <stddef.h>

#include "nccl.h"

ncclResult_t ncclGetVersion(int *version)
{
    if (version == NULL)
        return ncclInvalidArgument;
    *version = NCCL_VERSION_CODE;
    return ncclSuccess;
}
