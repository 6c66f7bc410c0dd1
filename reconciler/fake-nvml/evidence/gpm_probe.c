/* Read-only NVML GPM probe for tessera issue 19: what a real driver answers to the GPM calls the
 * nvml driver makes (support, sample buffers, GPU and MIG samples, SM_UTIL and SM_OCCUPANCY
 * between two samples, samples out of order or of two scopes, a bad struct version), idle and
 * while a child process keeps every SM busy with a spinning kernel (PTX through libcuda, so no
 * CUDA toolkit is needed). Changes nothing on the GPU. Build: cc -O1 -o gpm_probe gpm_probe.c -ldl */
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static const char *PTX =
    ".version 7.0\n.target sm_80\n.address_size 64\n"
    ".visible .entry spin(.param .u64 cycles) {\n"
    "  .reg .u64 %r<4>;\n  .reg .pred %p;\n"
    "  ld.param.u64 %r1, [cycles];\n  mov.u64 %r2, %clock64;\n"
    "loop:\n  mov.u64 %r3, %clock64;\n  sub.u64 %r3, %r3, %r2;\n"
    "  setp.lt.u64 %p, %r3, %r1;\n  @%p bra loop;\n  ret;\n}\n";

/* Keeps every SM busy for about `seconds`: 8 blocks of 128 threads per SM, spinning. */
static void spin_child(int seconds) {
  void *cu = dlopen("libcuda.so.1", RTLD_NOW);
  if (!cu) { printf("child: no libcuda\n"); _exit(1); }
  int (*cuInit)(unsigned) = dlsym(cu, "cuInit");
  int (*cuDeviceGet)(int *, int) = dlsym(cu, "cuDeviceGet");
  int (*cuDeviceGetAttribute)(int *, int, int) = dlsym(cu, "cuDeviceGetAttribute");
  int (*cuCtxCreate)(void **, unsigned, int) = dlsym(cu, "cuCtxCreate_v2");
  int (*cuModuleLoadData)(void **, const void *) = dlsym(cu, "cuModuleLoadData");
  int (*cuModuleGetFunction)(void **, void *, const char *) = dlsym(cu, "cuModuleGetFunction");
  int (*cuLaunchKernel)(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                        unsigned, void *, void **, void **) = dlsym(cu, "cuLaunchKernel");
  int (*cuCtxSynchronize)(void) = dlsym(cu, "cuCtxSynchronize");
  int dev, sms = 0, khz = 0;
  void *ctx, *mod, *fn;
  int a = cuInit(0), b = cuDeviceGet(&dev, 0);
  cuDeviceGetAttribute(&sms, 16 /* MULTIPROCESSOR_COUNT */, dev);
  cuDeviceGetAttribute(&khz, 13 /* CLOCK_RATE */, dev);
  int c = cuCtxCreate(&ctx, 0, dev), d = cuModuleLoadData(&mod, PTX);
  int e = cuModuleGetFunction(&fn, mod, "spin");
  unsigned long long cycles = (unsigned long long)khz * 1000ULL * seconds;
  void *args[] = {&cycles};
  int f = cuLaunchKernel(fn, sms * 8, 1, 1, 128, 1, 1, 0, 0, args, 0);
  printf("child: init %d dev %d ctx %d module %d function %d launch %d (%d SMs, %d kHz)\n", a, b,
         c, d, e, f, sms, khz);
  fflush(stdout);
  printf("child: synchronize %d\n", cuCtxSynchronize());
  fflush(stdout);
  _exit(0);
}

typedef int nvmlReturn_t;
typedef void *nvmlDevice_t;
typedef void *nvmlGpmSample_t;
typedef struct { unsigned version, isSupportedDevice; } nvmlGpmSupport_t;
typedef struct {
  unsigned metricId;
  nvmlReturn_t nvmlReturn;
  double value;
  struct { char *shortName, *longName, *unit; } metricInfo;
} nvmlGpmMetric_t;
typedef struct {
  unsigned version, numMetrics;
  nvmlGpmSample_t sample1, sample2;
  nvmlGpmMetric_t metrics[210];
} nvmlGpmMetricsGet_t;

static void *lib;
#define F(ret, name, ...) ret (*name)(__VA_ARGS__) = (ret (*)(__VA_ARGS__))dlsym(lib, #name)

static nvmlGpmMetricsGet_t m;

static void metrics(const char *what, nvmlGpmSample_t a, nvmlGpmSample_t b, unsigned version) {
  F(nvmlReturn_t, nvmlGpmMetricsGet, nvmlGpmMetricsGet_t *);
  memset(&m, 0, sizeof m);
  m.version = version;
  m.numMetrics = 3;
  m.sample1 = a;
  m.sample2 = b;
  m.metrics[0].metricId = 2;  /* SM_UTIL */
  m.metrics[1].metricId = 3;  /* SM_OCCUPANCY */
  m.metrics[2].metricId = 11; /* FP64_UTIL */
  int rc = nvmlGpmMetricsGet(&m);
  printf("%s: nvmlGpmMetricsGet rc=%d\n", what, rc);
  if (rc) return;
  for (int i = 0; i < 3; i++) {
    nvmlGpmMetric_t *x = &m.metrics[i];
    printf("  metric %u: rc=%d value=%g short=%s long=%s unit=%s\n", x->metricId, x->nvmlReturn,
           x->value, x->metricInfo.shortName ? x->metricInfo.shortName : "(null)",
           x->metricInfo.longName ? x->metricInfo.longName : "(null)",
           x->metricInfo.unit ? x->metricInfo.unit : "(null)");
  }
}

int main(void) {
  lib = dlopen("libnvidia-ml.so.1", RTLD_NOW);
  if (!lib) { printf("no libnvidia-ml: %s\n", dlerror()); return 1; }
  F(nvmlReturn_t, nvmlInit_v2, void);
  F(nvmlReturn_t, nvmlSystemGetDriverVersion, char *, unsigned);
  F(nvmlReturn_t, nvmlDeviceGetHandleByIndex_v2, unsigned, nvmlDevice_t *);
  F(nvmlReturn_t, nvmlDeviceGetName, nvmlDevice_t, char *, unsigned);
  F(nvmlReturn_t, nvmlDeviceGetMigMode, nvmlDevice_t, unsigned *, unsigned *);
  F(nvmlReturn_t, nvmlGpmQueryDeviceSupport, nvmlDevice_t, nvmlGpmSupport_t *);
  F(nvmlReturn_t, nvmlGpmSampleAlloc, nvmlGpmSample_t *);
  F(nvmlReturn_t, nvmlGpmSampleFree, nvmlGpmSample_t);
  F(nvmlReturn_t, nvmlGpmSampleGet, nvmlDevice_t, nvmlGpmSample_t);
  F(nvmlReturn_t, nvmlGpmMigSampleGet, nvmlDevice_t, unsigned, nvmlGpmSample_t);
  printf("nvmlInit_v2 rc=%d\n", nvmlInit_v2());
  char text[96] = {0};
  printf("driver version rc=%d %s\n", nvmlSystemGetDriverVersion(text, 95), text);
  nvmlDevice_t h;
  printf("handle rc=%d\n", nvmlDeviceGetHandleByIndex_v2(0, &h));
  printf("name rc=%d %s\n", nvmlDeviceGetName(h, text, 95), text);
  unsigned cur = 9, pend = 9;
  printf("mig mode rc=%d current=%u pending=%u\n", nvmlDeviceGetMigMode(h, &cur, &pend), cur, pend);
  nvmlGpmSupport_t s = {1, 9};
  printf("gpm support (version 1) rc=%d isSupportedDevice=%u\n", nvmlGpmQueryDeviceSupport(h, &s),
         s.isSupportedDevice);
  nvmlGpmSupport_t bad = {7, 9};
  printf("gpm support (version 7) rc=%d\n", nvmlGpmQueryDeviceSupport(h, &bad));
  nvmlGpmSample_t a = 0, b = 0, c = 0, unfilled = 0;
  printf("alloc rc=%d %d %d %d\n", nvmlGpmSampleAlloc(&a), nvmlGpmSampleAlloc(&b),
         nvmlGpmSampleAlloc(&c), nvmlGpmSampleAlloc(&unfilled));
  printf("alloc(NULL) rc=%d\n", nvmlGpmSampleAlloc(NULL));
  printf("sample a rc=%d\n", nvmlGpmSampleGet(h, a));
  sleep(1);
  printf("sample b rc=%d\n", nvmlGpmSampleGet(h, b));
  metrics("a then b (idle GPU, 1 s)", a, b, 1);
  metrics("b then a (reversed)", b, a, 1);
  metrics("a then a (same sample)", a, a, 1);
  metrics("a then unfilled", a, unfilled, 1);
  metrics("a then b, version 2", a, b, 2);
  fflush(stdout);
  pid_t child = fork();
  if (child == 0) spin_child(4);
  sleep(2); /* the context and the launch */
  printf("sample a (load) rc=%d\n", nvmlGpmSampleGet(h, a));
  sleep(1);
  printf("sample b (load) rc=%d\n", nvmlGpmSampleGet(h, b));
  metrics("a then b (every SM spinning, 1 s)", a, b, 1);
  fflush(stdout);
  waitpid(child, 0, 0);
  printf("mig sample gi 0 rc=%d\n", nvmlGpmMigSampleGet(h, 0, c));
  printf("mig sample gi 1 rc=%d\n", nvmlGpmMigSampleGet(h, 1, c));
  printf("free rc=%d %d %d %d\n", nvmlGpmSampleFree(a), nvmlGpmSampleFree(b),
         nvmlGpmSampleFree(c), nvmlGpmSampleFree(unfilled));
  printf("free(NULL) rc=%d\n", nvmlGpmSampleFree(NULL));
  return 0;
}
