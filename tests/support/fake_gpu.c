/* A fake CUDA runtime and NCCL in one library, for testing smhvd.preflight.gpu without a GPU.
 *
 * Built once (cc -shared -fPIC -O1) under both names the loader looks for: libcudart.so.12 and libnccl.so.2.
 * Memory is host memory, streams are dummy handles, and ncclAllReduce communicates nothing: the group that
 * holds it sleeps as long as a real one would take at FAKE_NCCL_BUSBW_GBPS (default 100) GB/s bus bandwidth.
 * Every variable is read at call time, so a test changes the behaviour by changing its own environment:
 *   FAKE_GPU_DRIVER_DIR  device count = entries in this directory (like /proc/driver/nvidia/gpus)
 *   FAKE_GPU_COUNT       device count when FAKE_GPU_DRIVER_DIR is not set (default 0)
 *   FAKE_NCCL_BUSBW_GBPS the bus bandwidth a caller measures
 *   FAKE_NCCL_FAIL=1     ncclCommInitRank returns ncclSystemError (2)
 */
#define _POSIX_C_SOURCE 200809L /* nanosleep */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

enum { cudaErrorInvalidValue = 1, cudaErrorMemoryAllocation = 2, cudaErrorNoDevice = 100,
       cudaErrorInvalidDevice = 101 };
enum { ncclSystemError = 2, ncclInvalidArgument = 4 };

typedef struct { char internal[128]; } ncclUniqueId;
typedef struct { int nranks, rank; } *ncclComm_t;

static const char ID_MAGIC[] = "fake-nccl-id";
static double pending_seconds; /* the longest all_reduce of the open group */
static int group_depth;

static int device_count(void) {
    const char *dir = getenv("FAKE_GPU_DRIVER_DIR");
    if (!dir) {
        const char *count = getenv("FAKE_GPU_COUNT");
        return count ? atoi(count) : 0;
    }
    DIR *d = opendir(dir);
    if (!d) return 0;
    int n = 0;
    for (struct dirent *e; (e = readdir(d));)
        n += strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
    closedir(d);
    return n;
}

static void sleep_seconds(double s) {
    struct timespec t = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    while (nanosleep(&t, &t)) {}
}

/* ---- CUDA runtime ---- */

int cudaGetDeviceCount(int *count) {
    *count = device_count();
    return *count > 0 ? 0 : cudaErrorNoDevice;
}
const char *cudaGetErrorString(int error) {
    static char text[32];
    snprintf(text, sizeof text, "fake error %d", error);
    return text;
}
int cudaSetDevice(int device) {
    return device >= 0 && device < device_count() ? 0 : cudaErrorInvalidDevice;
}
int cudaMalloc(void **ptr, size_t size) {
    *ptr = malloc(size);
    return *ptr ? 0 : cudaErrorMemoryAllocation;
}
int cudaMemset(void *ptr, int value, size_t count) {
    if (!ptr) return cudaErrorInvalidValue;
    memset(ptr, value, count);
    return 0;
}
int cudaFree(void *ptr) { free(ptr); return 0; }
int cudaStreamCreate(void **stream) {
    *stream = malloc(1);
    return *stream ? 0 : cudaErrorMemoryAllocation;
}
int cudaStreamSynchronize(void *stream) { return stream ? 0 : cudaErrorInvalidValue; }
int cudaStreamDestroy(void *stream) { free(stream); return 0; }

/* ---- NCCL ---- */

int ncclGetVersion(int *version) { *version = 22805; return 0; }
const char *ncclGetErrorString(int result) {
    static char text[32];
    snprintf(text, sizeof text, "fake nccl error %d", result);
    return text;
}
int ncclGetUniqueId(ncclUniqueId *id) {
    memset(id->internal, 0, sizeof id->internal);
    snprintf(id->internal, sizeof id->internal, "%s %d", ID_MAGIC, (int)getpid());
    return 0;
}
/* commId by value: a caller that passes a pointer instead fails the magic check. */
int ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank) {
    const char *fail = getenv("FAKE_NCCL_FAIL");
    if (fail && strcmp(fail, "1") == 0) return ncclSystemError;
    if (strncmp(commId.internal, ID_MAGIC, sizeof ID_MAGIC - 1) || nranks < 1 || rank < 0 || rank >= nranks)
        return ncclInvalidArgument;
    *comm = malloc(sizeof **comm);
    if (!*comm) return ncclSystemError;
    (*comm)->nranks = nranks;
    (*comm)->rank = rank;
    return 0;
}
int ncclCommDestroy(ncclComm_t comm) { free(comm); return 0; }
int ncclGroupStart(void) { group_depth++; return 0; }
int ncclGroupEnd(void) {
    if (group_depth == 0) return ncclInvalidArgument;
    if (--group_depth == 0 && pending_seconds > 0) {
        sleep_seconds(pending_seconds);
        pending_seconds = 0;
    }
    return 0;
}
/* count float32 elements; datatype 7 (ncclFloat32) and op 0 (ncclSum) are all this fake knows. */
int ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count, int datatype, int op, ncclComm_t comm,
                  void *stream) {
    if (!sendbuff || !recvbuff || !comm || !stream || datatype != 7 || op != 0) return ncclInvalidArgument;
    const char *rate = getenv("FAKE_NCCL_BUSBW_GBPS");
    double bytes = (double)count * 4, n = comm->nranks;
    double moved = n > 1 ? bytes * 2 * (n - 1) / n : bytes; /* what busbw counts (nccl-tests) */
    double seconds = moved / ((rate ? atof(rate) : 100) * 1e9);
    if (seconds > pending_seconds) pending_seconds = seconds;
    if (group_depth == 0) {
        ncclGroupStart();
        return ncclGroupEnd();
    }
    return 0;
}
