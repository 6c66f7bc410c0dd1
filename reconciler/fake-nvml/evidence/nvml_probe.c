#define _GNU_SOURCE
/* Read-only NVML probe for tessera issue 24. Calls only Get/query functions, plus (with
 * --cuda N) N child processes that each open a CUDA context, so that the process list has
 * entries whose stride can be measured. Never sets a mode, resets, creates or destroys. */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/wait.h>

typedef int nvmlReturn_t;
typedef void *nvmlDevice_t;
typedef void *nvmlGpuInstance_t;
typedef struct { unsigned long long total, free, used; } nvmlMemory_t;
typedef struct { unsigned start, size; } nvmlGpuInstancePlacement_t;
typedef struct {
  unsigned id, isP2pSupported, sliceCount, instanceCount, multiprocessorCount, copyEngineCount,
      decoderCount, encoderCount, jpegCount, ofaCount;
  unsigned long long memorySizeMB;
} nvmlGpuInstanceProfileInfo_t;
typedef struct {
  unsigned version, id, isP2pSupported, sliceCount, instanceCount, multiprocessorCount,
      copyEngineCount, decoderCount, encoderCount, jpegCount, ofaCount;
  unsigned long long memorySizeMB;
  char name[96];
} nvmlGpuInstanceProfileInfo_v2_t;

static void *lib;
#define SYM(name) ((void *)dlsym(lib, name))
#define F(ret, name, ...) ret (*name)(__VA_ARGS__) = (ret (*)(__VA_ARGS__))SYM(#name)

static const char *estr(int rc) {
  F(const char *, nvmlErrorString, int);
  return nvmlErrorString ? nvmlErrorString(rc) : "?";
}

static void cuda_child(int seconds) {
  void *cu = dlopen("libcuda.so.1", RTLD_NOW);
  if (!cu) { fprintf(stderr, "child: no libcuda: %s\n", dlerror()); _exit(1); }
  int (*cuInit)(unsigned) = dlsym(cu, "cuInit");
  int (*cuDeviceGet)(int *, int) = dlsym(cu, "cuDeviceGet");
  int (*cuCtxCreate)(void **, unsigned, int) = dlsym(cu, "cuCtxCreate_v2");
  int dev; void *ctx;
  int a = cuInit(0), b = cuDeviceGet(&dev, 0), c = cuCtxCreate(&ctx, 0, dev);
  printf("child %d: cuInit %d cuDeviceGet %d cuCtxCreate %d\n", getpid(), a, b, c);
  fflush(stdout);
  sleep(seconds);
  _exit(0);
}

static void processes(nvmlDevice_t h, const char *fn) {
  nvmlReturn_t (*f)(nvmlDevice_t, unsigned *, void *) = SYM(fn);
  if (!f) { printf("%s: symbol absent\n", fn); return; }
  unsigned n = 0;
  int rc = f(h, &n, NULL);
  printf("%s(count=0, NULL): rc=%d (%s) count=%u\n", fn, rc, estr(rc), n);
  unsigned char buf[64 * 40];
  memset(buf, 0xAB, sizeof buf);
  unsigned cap = 32;
  n = cap;
  rc = f(h, &n, buf);
  printf("%s(count=%u, buf): rc=%d (%s) count=%u\n", fn, cap, rc, estr(rc), n);
  int last = 0;
  for (int i = 0; i < (int)sizeof buf; i++) if (buf[i] != 0xAB) last = i + 1;
  printf("%s: bytes written (last non-sentinel byte + 1) = %d; per entry = %.2f\n", fn, last,
         n ? (double)last / n : 0.0);
  for (unsigned e = 0; e < n && e < 4; e++) {
    printf("%s: raw[%u*32..] =", fn, e);
    for (int i = 0; i < 32; i++) printf(" %02x", buf[e * 32 + i]);
    printf("\n");
  }
}

int main(int argc, char **argv) {
  int children = 0;
  for (int i = 1; i < argc; i++)
    if (!strcmp(argv[i], "--cuda") && i + 1 < argc) children = atoi(argv[++i]);
  printf("uid=%d\n", getuid());
  lib = dlopen("libnvidia-ml.so.1", RTLD_NOW);
  if (!lib) { printf("dlopen: %s\n", dlerror()); return 1; }
  Dl_info di;
  F(nvmlReturn_t, nvmlInit_v2, void);
  if (dladdr((void *)nvmlInit_v2, &di)) printf("library: %s\n", di.dli_fname);
  int rc = nvmlInit_v2();
  printf("nvmlInit_v2: rc=%d\n", rc);
  if (rc) return 1;
  printf("error strings:");
  for (int c = 0; c <= 31; c++) printf(" [%d]=%s", c, estr(c));
  printf(" [999]=%s\n", estr(999));
  char s[256];
  F(nvmlReturn_t, nvmlSystemGetDriverVersion, char *, unsigned);
  F(nvmlReturn_t, nvmlSystemGetNVMLVersion, char *, unsigned);
  F(nvmlReturn_t, nvmlSystemGetCudaDriverVersion_v2, int *);
  rc = nvmlSystemGetDriverVersion(s, sizeof s); printf("driver version: rc=%d %s\n", rc, s);
  rc = nvmlSystemGetNVMLVersion(s, sizeof s); printf("nvml version: rc=%d %s\n", rc, s);
  int cv = 0; rc = nvmlSystemGetCudaDriverVersion_v2(&cv); printf("cuda driver version: rc=%d %d\n", rc, cv);

  fflush(stdout); /* a forked child must not print the parent's buffered lines again */
  pid_t kids[16]; int nk = 0;
  for (int i = 0; i < children && i < 16; i++) {
    pid_t p = fork();
    if (p == 0) cuda_child(12);
    kids[nk++] = p;
    printf("spawned cuda child pid %d\n", p);
  }
  if (nk) sleep(6);

  F(nvmlReturn_t, nvmlDeviceGetCount_v2, unsigned *);
  F(nvmlReturn_t, nvmlDeviceGetHandleByIndex_v2, unsigned, nvmlDevice_t *);
  F(nvmlReturn_t, nvmlDeviceGetName, nvmlDevice_t, char *, unsigned);
  F(nvmlReturn_t, nvmlDeviceGetUUID, nvmlDevice_t, char *, unsigned);
  F(nvmlReturn_t, nvmlDeviceGetMemoryInfo, nvmlDevice_t, nvmlMemory_t *);
  F(nvmlReturn_t, nvmlDeviceGetMigMode, nvmlDevice_t, unsigned *, unsigned *);
  F(nvmlReturn_t, nvmlDeviceGetMaxMigDeviceCount, nvmlDevice_t, unsigned *);
  F(nvmlReturn_t, nvmlDeviceGetMigDeviceHandleByIndex, nvmlDevice_t, unsigned, nvmlDevice_t *);
  F(nvmlReturn_t, nvmlDeviceIsMigDeviceHandle, nvmlDevice_t, unsigned *);
  F(nvmlReturn_t, nvmlDeviceGetGpuInstanceProfileInfo, nvmlDevice_t, unsigned, nvmlGpuInstanceProfileInfo_t *);
  F(nvmlReturn_t, nvmlDeviceGetGpuInstanceProfileInfoV, nvmlDevice_t, unsigned, nvmlGpuInstanceProfileInfo_v2_t *);
  F(nvmlReturn_t, nvmlDeviceGetGpuInstancePossiblePlacements_v2, nvmlDevice_t, unsigned, nvmlGpuInstancePlacement_t *, unsigned *);
  F(nvmlReturn_t, nvmlDeviceGetGpuInstanceRemainingCapacity, nvmlDevice_t, unsigned, unsigned *);
  F(nvmlReturn_t, nvmlDeviceGetGpuInstances, nvmlDevice_t, unsigned, nvmlGpuInstance_t *, unsigned *);
  F(nvmlReturn_t, nvmlDeviceGetGpuInstanceById, nvmlDevice_t, unsigned, nvmlGpuInstance_t *);

  unsigned count = 0;
  rc = nvmlDeviceGetCount_v2(&count);
  printf("device count: rc=%d %u\n", rc, count);
  for (unsigned d = 0; d < count; d++) {
    nvmlDevice_t h;
    rc = nvmlDeviceGetHandleByIndex_v2(d, &h);
    printf("== gpu %u handle rc=%d\n", d, rc);
    rc = nvmlDeviceGetName(h, s, sizeof s); printf("name: rc=%d %s\n", rc, s);
    rc = nvmlDeviceGetUUID(h, s, sizeof s); printf("uuid: rc=%d %s\n", rc, s);
    nvmlMemory_t m; rc = nvmlDeviceGetMemoryInfo(h, &m);
    printf("memory: rc=%d total=%llu (%llu MiB)\n", rc, m.total, m.total >> 20);
    unsigned cur = 9, pen = 9;
    rc = nvmlDeviceGetMigMode(h, &cur, &pen); printf("mig mode: rc=%d (%s) current=%u pending=%u\n", rc, estr(rc), cur, pen);
    unsigned max = 0; rc = nvmlDeviceGetMaxMigDeviceCount(h, &max);
    printf("max mig device count: rc=%d (%s) %u\n", rc, estr(rc), max);
    unsigned ism = 9; rc = nvmlDeviceIsMigDeviceHandle(h, &ism); printf("is mig device handle: rc=%d %u\n", rc, ism);
    for (unsigned i = 0; i < (max ? max : 1) + 1; i++) {
      nvmlDevice_t mh = 0;
      rc = nvmlDeviceGetMigDeviceHandleByIndex(h, i, &mh);
      printf("mig device handle by index %u: rc=%d (%s)\n", i, rc, estr(rc));
    }
    for (unsigned e = 0; e <= 20; e++) {
      nvmlGpuInstanceProfileInfo_t pi; memset(&pi, 0, sizeof pi);
      rc = nvmlDeviceGetGpuInstanceProfileInfo(h, e, &pi);
      printf("profile info enum %u: rc=%d (%s)", e, rc, estr(rc));
      if (!rc) printf(" id=%u slices=%u instances=%u sms=%u memMB=%llu", pi.id, pi.sliceCount, pi.instanceCount, pi.multiprocessorCount, pi.memorySizeMB);
      if (nvmlDeviceGetGpuInstanceProfileInfoV) {
        nvmlGpuInstanceProfileInfo_v2_t p2; memset(&p2, 0, sizeof p2);
        p2.version = (unsigned)sizeof p2 | (2u << 24);
        int rc2 = nvmlDeviceGetGpuInstanceProfileInfoV(h, e, &p2);
        printf(" | V: rc=%d", rc2);
        if (!rc2) printf(" id=%u name=%s", p2.id, p2.name);
      }
      printf("\n");
    }
    for (unsigned id = 0; id <= 20; id++) {
      unsigned n = 0;
      rc = nvmlDeviceGetGpuInstancePossiblePlacements_v2(h, id, NULL, &n);
      printf("possible placements id %u: rc=%d (%s) count=%u", id, rc, estr(rc), n);
      if (!rc && n) {
        nvmlGpuInstancePlacement_t pl[16]; unsigned k = 16;
        rc = nvmlDeviceGetGpuInstancePossiblePlacements_v2(h, id, pl, &k);
        printf(" | filled rc=%d count=%u:", rc, k);
        for (unsigned j = 0; j < k && j < 16; j++) printf(" %u+%u", pl[j].start, pl[j].size);
      }
      unsigned cap = 0;
      rc = nvmlDeviceGetGpuInstanceRemainingCapacity(h, id, &cap);
      printf(" | remaining capacity rc=%d (%s) %u", rc, estr(rc), cap);
      nvmlGpuInstance_t gis[16]; unsigned gn = 0;
      rc = nvmlDeviceGetGpuInstances(h, id, gis, &gn);
      printf(" | get gpu instances rc=%d (%s) count=%u\n", rc, estr(rc), gn);
    }
    nvmlGpuInstance_t gi;
    rc = nvmlDeviceGetGpuInstanceById(h, 1, &gi); printf("gpu instance by id 1: rc=%d (%s)\n", rc, estr(rc));
    processes(h, "nvmlDeviceGetComputeRunningProcesses_v3");
    processes(h, "nvmlDeviceGetComputeRunningProcesses_v2");
    processes(h, "nvmlDeviceGetComputeRunningProcesses");
    processes(h, "nvmlDeviceGetGraphicsRunningProcesses_v3");
  }
  for (int i = 0; i < nk; i++) waitpid(kids[i], NULL, 0);
  return 0;
}
