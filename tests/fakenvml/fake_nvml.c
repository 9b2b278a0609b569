/*
 * A fake libnvidia-ml.so.1 for tests.
 *
 * The real nvidia-ml-py loads it through LD_LIBRARY_PATH.  Everything it
 * reports comes from a line-based state file named by $FAKE_NVML_STATE
 * (format: README.md next to this file).  The file is re-read whenever its
 * inode, size or mtime changes, so a test can rewrite it while the program
 * under test runs.
 *
 * Time-varying values (utilization) are pure functions of the wall clock
 * (sped up by `time_scale` if asked; CLOCK_BOOTTIME, placed on the epoch, for
 * the calls stamped on the boot clock) and of piecewise-constant patterns, so
 * the driver's "sample buffers" are computed on demand: sample k covers
 * (t_{k-1}, t_k] with t_k = k * period microseconds since the epoch, and its
 * value is the exact mean of the pattern over that interval (rounded to an
 * integer percent).
 *
 * Never crash the host: every malformed input becomes an NVML error plus one
 * line on stderr.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* strtok_r, st_mtim */
#endif
#define NVML_NO_UNVERSIONED_FUNC_DEFS /* we define the _vN symbols ourselves */
#include <nvml.h>

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <poll.h>
#include <unistd.h>
#include <time.h>

#define MAX_DEV 64      /* device index must be below this */
#define MAX_MIG 8       /* MIG devices per parent (real GPUs: at most 7) */
#define MAX_SETS 64     /* live event sets */
#define STR_LEN 128
#define NO_ID 0xFFFFFFFFu
#define MAX_FILE (64u << 20)

#define MAX_POLICY 12    /* NVML_PERF_POLICY_* values are below this */
#define MAX_LINKS 18     /* NVLinks per device (NVML_NVLINK_MAX_LINKS of 12.x headers) */
#define THROTTLE_PERIOD_S 1.0 /* a reason active FRACTION of the time: the first part of each */

#define KIND_COMPUTE 1u
#define KIND_GRAPHICS 2u
#define KIND_MPS 4u

#define SUPPORTED_EVENTS                                                     \
    (nvmlEventTypeSingleBitEccError | nvmlEventTypeDoubleBitEccError |       \
     nvmlEventTypePState | nvmlEventTypeXidCriticalError | nvmlEventTypeClock)

/* ------------------------------------------------------------------ state */

typedef struct {
    double dur, pct;
} seg_t;

/* One piecewise-constant pattern, in effect from `from` (epoch s) until the
 * next trace's `from`.  Keeping a short history lets a rewrite change a
 * pattern without rewriting samples that are still in the buffer. */
typedef struct {
    double from;
    int derived; /* device: min(100, sum of processes); process: no samples */
    double origin;
    int repeat;
    int nseg;
    seg_t *segs;
    double period;
} trace_t;

typedef struct {
    int n, cap;
    trace_t *v;
} tracelist_t;

typedef struct {
    unsigned pid;
    unsigned kinds;
    unsigned long long mem;
    unsigned gi, ci;
    tracelist_t sm;
    double sm_scale; /* psm_scale: smUtil reported = this * the true mean (may pass 100) */
    unsigned garbage; /* pgarbage: one read in this many also returns a garbage sample */
} proc_t;

typedef struct {
    unsigned gi, ci;
    unsigned long long total, used;
    char uuid[STR_LEN], name[STR_LEN];
} mig_t;

/* One GPM metric's trace history on a whole GPU (gi NO_ID) or one MIG GPU
 * instance: percent for activities, MiB/s for PCIe and NVLink traffic. */
typedef struct {
    unsigned gi, metric;
    tracelist_t tl;
} gpmtl_t;

typedef struct {
    long long seq;
    unsigned long long xid;
    double time; /* 0: deliver even to sets registered after it */
    unsigned gi, ci;
} xid_t;

typedef struct {
    char fn[STR_LEN];
    nvmlReturn_t err;
    double secs;
    int once, used; /* error_once: fails one call per state file, then works */
} inject_t;

typedef struct {
    int n, cap;
    inject_t *v;
} injlist_t;

typedef struct {
    int present;
    unsigned index, minor;
    char uuid[STR_LEN], name[STR_LEN], serial[STR_LEN], pci[STR_LEN];
    unsigned pci_device_id, pci_subsystem_id;
    unsigned long long mem_total, mem_reserved;
    long long mem_used; /* -1: sum of the processes */
    double power_w, energy_base_mj, energy_origin;
    int temp;
    unsigned long long ecc_c, ecc_u;
    int lost;
    tracelist_t util;
    int nproc, capproc;
    proc_t *procs;
    int nmig;
    int mig_on; /* MIG mode enabled with no instances yet (with instances it always is) */
    mig_t mig[MAX_MIG];
    int nxid, capxid;
    xid_t *xids;
    int gpm_support; /* nvmlGpmQueryDeviceSupport says yes (Hopper and later) */
    int ngpm, capgpm;
    gpmtl_t *gpm;
    /* violation counters by NVML_PERF_POLICY_*: ns = base + active time since origin */
    int viol_on[MAX_POLICY];
    double viol_base_ns[MAX_POLICY], viol_origin[MAX_POLICY], viol_fraction[MAX_POLICY];
    int sm_clock_set;
    unsigned sm_clock, sm_clock_max; /* MHz */
    int remap_set;
    unsigned remap[4]; /* correctable, uncorrectable, pending, failure */
    int pcie_set;
    unsigned pcie_replays;
    int nvlink_any, nvlink_on[MAX_LINKS];
    unsigned long long nvlink_err[MAX_LINKS][4]; /* NVML_NVLINK_ERROR_DL_REPLAY..CRC_DATA */
    injlist_t errors, sleeps;
} fdev_t;

typedef struct {
    char driver[STR_LEN], nvml_version[STR_LEN];
    int cuda_version;
    unsigned period_ms, buffer_samples;
    int proc_latest;  /* process_util_mode latest */
    int zero_samples; /* report processes' 0 % samples too */
    double time_scale, time_origin; /* fake clock = origin + (real - origin) * scale */
    double jitter;       /* device samples: up to this fraction of a period late */
    unsigned miss_every; /* device samples: about one in N missing (0: none) */
    double clock_offset; /* seconds added to every sample timestamp reported */
    int device_boot, process_boot; /* stamp device / process samples on the boot clock */
    double boot_time;    /* fake epoch time at which the boot clock reads 0 */
    int boot_time_set;   /* 0: the host's boot time (CLOCK_REALTIME - CLOCK_BOOTTIME) */
    int idle_dry;        /* device samples of 0 % are not taken: the buffer runs dry */
    double stagger_s;    /* process PID's samples come (PID % 10) / 9 of this late */
    double energy_step_ms; /* the energy counter moves in steps this far apart (0: smooth) */
    nvmlReturn_t init_error;
    injlist_t errors, sleeps;
    int ndev;
    fdev_t dev[MAX_DEV]; /* by NVML index */
} state_t;

/* Handles are addresses in these static tables, so a handle stays valid (and
 * keeps meaning "device index i" / "MIG device j of i") across reloads. */
struct nvmlDevice_st {
    int slot, mig; /* mig < 0: the parent device */
};
static struct nvmlDevice_st g_parent[MAX_DEV];
static struct nvmlDevice_st g_mig[MAX_DEV][MAX_MIG];

struct nvmlEventSet_st {
    int used;
    unsigned long long mask[MAX_DEV];
    double reg_time[MAX_DEV];
    long long last_seq[MAX_DEV];
    int has_last[MAX_DEV];
};
static struct nvmlEventSet_st g_sets[MAX_SETS];

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static int g_refcount;
/* MIG mode is on with instances, or turned on before any is made. */
#define MIG_ENABLED(d) ((d)->nmig > 0 || (d)->mig_on)

static state_t *g_state;
/* Identity of the file g_state came from, and of the last bad file (so each
 * bad version is reported once, not on every call). */
static struct stat g_loaded_st, g_bad_st;
static int g_have_loaded, g_have_bad, g_warned_unset;

static void init_tables(void)
{
    for (int i = 0; i < MAX_DEV; i++) {
        g_parent[i].slot = i;
        g_parent[i].mig = -1;
        for (int j = 0; j < MAX_MIG; j++) {
            g_mig[i][j].slot = i;
            g_mig[i][j].mig = j;
        }
    }
}

/* ----------------------------------------------------------------- errors */

static const struct {
    const char *name;
    nvmlReturn_t code;
    const char *text;
} g_errors[] = {
    {"SUCCESS", NVML_SUCCESS, "Success"},
    {"UNINITIALIZED", NVML_ERROR_UNINITIALIZED, "Uninitialized"},
    {"INVALID_ARGUMENT", NVML_ERROR_INVALID_ARGUMENT, "Invalid Argument"},
    {"NOT_SUPPORTED", NVML_ERROR_NOT_SUPPORTED, "Not Supported"},
    {"NO_PERMISSION", NVML_ERROR_NO_PERMISSION, "Insufficient Permissions"},
    {"ALREADY_INITIALIZED", NVML_ERROR_ALREADY_INITIALIZED, "Already Initialized"},
    {"NOT_FOUND", NVML_ERROR_NOT_FOUND, "Not Found"},
    {"INSUFFICIENT_SIZE", NVML_ERROR_INSUFFICIENT_SIZE, "Insufficient Size"},
    {"INSUFFICIENT_POWER", NVML_ERROR_INSUFFICIENT_POWER, "Insufficient External Power"},
    {"DRIVER_NOT_LOADED", NVML_ERROR_DRIVER_NOT_LOADED, "Driver Not Loaded"},
    {"TIMEOUT", NVML_ERROR_TIMEOUT, "Timeout"},
    {"IRQ_ISSUE", NVML_ERROR_IRQ_ISSUE, "Interrupt Request Issue"},
    {"LIBRARY_NOT_FOUND", NVML_ERROR_LIBRARY_NOT_FOUND, "NVML Shared Library Not Found"},
    {"FUNCTION_NOT_FOUND", NVML_ERROR_FUNCTION_NOT_FOUND, "Function Not Found"},
    {"CORRUPTED_INFOROM", NVML_ERROR_CORRUPTED_INFOROM, "Corrupted infoROM"},
    {"GPU_IS_LOST", NVML_ERROR_GPU_IS_LOST, "GPU is lost"},
    {"RESET_REQUIRED", NVML_ERROR_RESET_REQUIRED, "GPU requires restart"},
    {"OPERATING_SYSTEM", NVML_ERROR_OPERATING_SYSTEM, "The operating system has blocked the request"},
    {"LIB_RM_VERSION_MISMATCH", NVML_ERROR_LIB_RM_VERSION_MISMATCH, "Driver/library version mismatch"},
    {"IN_USE", NVML_ERROR_IN_USE, "In use by another client"},
    {"MEMORY", NVML_ERROR_MEMORY, "Insufficient Memory"},
    {"NO_DATA", NVML_ERROR_NO_DATA, "No data"},
    {"INSUFFICIENT_RESOURCES", NVML_ERROR_INSUFFICIENT_RESOURCES, "Insufficient resources"},
    {"ARGUMENT_VERSION_MISMATCH", NVML_ERROR_ARGUMENT_VERSION_MISMATCH, "Argument version mismatch"},
    {"DEPRECATED", NVML_ERROR_DEPRECATED, "Deprecated"},
    {"NOT_READY", NVML_ERROR_NOT_READY, "Not ready"},
    {"GPU_NOT_FOUND", NVML_ERROR_GPU_NOT_FOUND, "No GPUs were found"},
    {"INVALID_STATE", NVML_ERROR_INVALID_STATE, "Invalid state"},
    {"UNKNOWN", NVML_ERROR_UNKNOWN, "Unknown Error"},
};

const char *nvmlErrorString(nvmlReturn_t result)
{
    for (size_t i = 0; i < sizeof g_errors / sizeof g_errors[0]; i++)
        if (g_errors[i].code == result)
            return g_errors[i].text;
    return "Unknown Error";
}

static int parse_error_name(const char *s, nvmlReturn_t *out)
{
    if (strncmp(s, "NVML_ERROR_", 11) == 0)
        s += 11;
    for (size_t i = 0; i < sizeof g_errors / sizeof g_errors[0]; i++) {
        if (strcmp(g_errors[i].name, s) == 0) {
            *out = g_errors[i].code;
            return 0;
        }
    }
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < 0 || v > 100000)
        return -1;
    *out = (nvmlReturn_t)v;
    return 0;
}

/* ----------------------------------------------------------------- memory */

static void free_tracelist(tracelist_t *tl)
{
    for (int i = 0; i < tl->n; i++)
        free(tl->v[i].segs);
    free(tl->v);
    tl->v = NULL;
    tl->n = tl->cap = 0;
}

static void free_state(state_t *st)
{
    if (!st)
        return;
    for (int i = 0; i < MAX_DEV; i++) {
        fdev_t *d = &st->dev[i];
        free_tracelist(&d->util);
        for (int p = 0; p < d->nproc; p++)
            free_tracelist(&d->procs[p].sm);
        free(d->procs);
        free(d->xids);
        for (int g = 0; g < d->ngpm; g++)
            free_tracelist(&d->gpm[g].tl);
        free(d->gpm);
        free(d->errors.v);
        free(d->sleeps.v);
    }
    free(st->errors.v);
    free(st->sleeps.v);
    free(st);
}

/* Grow *v (of *cap elements of size sz) to hold n + 1; 0 on success. */
static int grow(void **v, int *cap, int n, size_t sz)
{
    if (n < *cap)
        return 0;
    int ncap = *cap ? *cap * 2 : 8;
    void *nv = realloc(*v, (size_t)ncap * sz);
    if (!nv)
        return -1;
    *v = nv;
    *cap = ncap;
    return 0;
}

/* ------------------------------------------------------------- GPM table */

/* The GPM metrics the fake knows (others answer NOT_SUPPORTED per metric).
 * Traffic is in MiB/s and makes no sense per MIG instance. */
typedef struct {
    unsigned id;
    const char *shortName, *longName, *unit;
    double max;
    int device_only;
} gpm_info_t;

static const gpm_info_t g_gpm_info[] = {
    {NVML_GPM_METRIC_GRAPHICS_UTIL, "gr_util", "graphics activity", "%", 100, 0},
    {NVML_GPM_METRIC_SM_UTIL, "sm_util", "SM activity", "%", 100, 0},
    {NVML_GPM_METRIC_SM_OCCUPANCY, "sm_occupancy", "SM occupancy", "%", 100, 0},
    {NVML_GPM_METRIC_INTEGER_UTIL, "integer_util", "integer activity", "%", 100, 0},
    {NVML_GPM_METRIC_ANY_TENSOR_UTIL, "any_tensor_util", "tensor activity", "%", 100, 0},
    {NVML_GPM_METRIC_DFMA_TENSOR_UTIL, "dfma_tensor_util", "DFMA tensor activity", "%", 100, 0},
    {NVML_GPM_METRIC_HMMA_TENSOR_UTIL, "hmma_tensor_util", "HMMA tensor activity", "%", 100, 0},
    {NVML_GPM_METRIC_IMMA_TENSOR_UTIL, "imma_tensor_util", "IMMA tensor activity", "%", 100, 0},
    {NVML_GPM_METRIC_DRAM_BW_UTIL, "dram_bw_util", "DRAM bandwidth use", "%", 100, 0},
    {NVML_GPM_METRIC_FP64_UTIL, "fp64_util", "FP64 activity", "%", 100, 0},
    {NVML_GPM_METRIC_FP32_UTIL, "fp32_util", "FP32 activity", "%", 100, 0},
    {NVML_GPM_METRIC_FP16_UTIL, "fp16_util", "FP16 activity", "%", 100, 0},
    {NVML_GPM_METRIC_PCIE_TX_PER_SEC, "pcie_tx", "PCIe transmit", "MiB/s", 1e9, 1},
    {NVML_GPM_METRIC_PCIE_RX_PER_SEC, "pcie_rx", "PCIe receive", "MiB/s", 1e9, 1},
    {NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC, "nvlink_rx", "NVLink receive", "MiB/s", 1e9, 1},
    {NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC, "nvlink_tx", "NVLink transmit", "MiB/s", 1e9, 1},
};

static const gpm_info_t *gpm_metric_info(unsigned id)
{
    for (size_t i = 0; i < sizeof g_gpm_info / sizeof g_gpm_info[0]; i++)
        if (g_gpm_info[i].id == id)
            return &g_gpm_info[i];
    return NULL;
}

/* ---------------------------------------------------------------- parsing */

typedef struct {
    const char *path;
    int line;
    char msg[256];
} perr_t;

static int fail(perr_t *pe, const char *fmt, const char *arg)
{
    snprintf(pe->msg, sizeof pe->msg, fmt, arg ? arg : "");
    return -1;
}

static char *next_tok(char **p)
{
    char *s = *p;
    while (*s == ' ' || *s == '\t')
        s++;
    if (!*s) {
        *p = s;
        return NULL;
    }
    char *t = s;
    while (*s && *s != ' ' && *s != '\t')
        s++;
    if (*s)
        *s++ = '\0';
    *p = s;
    return t;
}

static char *rest_of_line(char **p)
{
    char *s = *p;
    while (*s == ' ' || *s == '\t')
        s++;
    size_t n = strlen(s);
    while (n && (s[n - 1] == ' ' || s[n - 1] == '\t'))
        s[--n] = '\0';
    *p = s + n;
    return s;
}

/* Decimal, or hexadecimal with 0x (never octal: "010" is ten). */
static int num_base(const char *s)
{
    if (*s == '-' || *s == '+')
        s++;
    return s[0] == '0' && (s[1] == 'x' || s[1] == 'X') ? 16 : 10;
}

static int parse_ull(const char *s, unsigned long long *out)
{
    if (!s || !*s || *s == '-')
        return -1;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, num_base(s));
    if (errno || *end)
        return -1;
    *out = v;
    return 0;
}

static int parse_uint(const char *s, unsigned *out)
{
    unsigned long long v;
    if (parse_ull(s, &v) || v > UINT_MAX)
        return -1;
    *out = (unsigned)v;
    return 0;
}

static int parse_ll(const char *s, long long *out)
{
    if (!s || !*s)
        return -1;
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, num_base(s));
    if (errno || *end)
        return -1;
    *out = v;
    return 0;
}

static int parse_dbl(const char *s, double *out)
{
    if (!s || !*s)
        return -1;
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || *end || !isfinite(v))
        return -1;
    *out = v;
    return 0;
}

/* "-" means "not set" for instance ids. */
static int parse_id(const char *s, unsigned *out)
{
    if (s && strcmp(s, "-") == 0) {
        *out = NO_ID;
        return 0;
    }
    return parse_uint(s, out);
}

static int copy_str(char *dst, const char *src)
{
    if (!src || strlen(src) >= STR_LEN)
        return -1;
    strcpy(dst, src);
    return 0;
}

/* util|psm FROM derived|none
 * util|psm FROM ORIGIN REPEAT DUR:PCT [DUR:PCT ...]
 * Values run 0..maxv (100 for percentages). */
static int parse_trace(char **p, tracelist_t *tl, double maxv, perr_t *pe)
{
    trace_t tr;
    memset(&tr, 0, sizeof tr);
    if (parse_dbl(next_tok(p), &tr.from))
        return fail(pe, "bad FROM time in trace", NULL);
    if (tl->n && tr.from < tl->v[tl->n - 1].from)
        return fail(pe, "trace FROM times must not decrease", NULL);
    char *t = next_tok(p);
    if (!t)
        return fail(pe, "trace needs 'derived'/'none' or ORIGIN REPEAT segments", NULL);
    if (strcmp(t, "derived") == 0 || strcmp(t, "none") == 0) {
        tr.derived = 1;
    } else {
        unsigned rep;
        if (parse_dbl(t, &tr.origin))
            return fail(pe, "bad ORIGIN in trace: %s", t);
        if (parse_uint(next_tok(p), &rep) || rep > 1)
            return fail(pe, "trace REPEAT must be 0 or 1", NULL);
        tr.repeat = (int)rep;
        int cap = 0;
        char *s;
        while ((s = next_tok(p)) != NULL) {
            char *colon = strchr(s, ':');
            seg_t sg;
            if (!colon)
                return fail(pe, "segment must be DUR:PCT, got %s", s);
            *colon = '\0';
            if (parse_dbl(s, &sg.dur) || parse_dbl(colon + 1, &sg.pct) ||
                sg.dur <= 0 || sg.pct < 0 || sg.pct > maxv) {
                free(tr.segs);
                return fail(pe, "bad segment (need DUR>0, 0<=VALUE<=100, or 1e9 for traffic) "
                                "near %s", s);
            }
            if (grow((void **)&tr.segs, &cap, tr.nseg, sizeof(seg_t))) {
                free(tr.segs);
                return fail(pe, "out of memory", NULL);
            }
            tr.segs[tr.nseg++] = sg;
            tr.period += sg.dur;
        }
        if (!tr.nseg)
            return fail(pe, "trace has no segments", NULL);
    }
    if (grow((void **)&tl->v, &tl->cap, tl->n, sizeof(trace_t))) {
        free(tr.segs);
        return fail(pe, "out of memory", NULL);
    }
    tl->v[tl->n++] = tr;
    return 0;
}

static int parse_inject(char **p, injlist_t *l, int is_sleep, perr_t *pe, int once)
{
    inject_t in;
    memset(&in, 0, sizeof in);
    in.once = once;
    if (copy_str(in.fn, next_tok(p)))
        return fail(pe, "injection needs a function name", NULL);
    char *v = next_tok(p);
    if (is_sleep) {
        if (parse_dbl(v, &in.secs) || in.secs < 0 || in.secs > 3600)
            return fail(pe, "bad sleep seconds for %s", in.fn);
    } else if (!v || parse_error_name(v, &in.err)) {
        return fail(pe, "bad error name for %s", in.fn);
    }
    if (grow((void **)&l->v, &l->cap, l->n, sizeof(inject_t)))
        return fail(pe, "out of memory", NULL);
    l->v[l->n++] = in;
    return 0;
}

static int parse_kinds(const char *s, unsigned *out)
{
    if (!s)
        return -1;
    char buf[STR_LEN];
    if (copy_str(buf, s))
        return -1;
    unsigned k = 0;
    for (char *save = NULL, *t = strtok_r(buf, "+", &save); t; t = strtok_r(NULL, "+", &save)) {
        if (strcmp(t, "compute") == 0)
            k |= KIND_COMPUTE;
        else if (strcmp(t, "graphics") == 0)
            k |= KIND_GRAPHICS;
        else if (strcmp(t, "mps") == 0)
            k |= KIND_MPS;
        else
            return -1;
    }
    if (!k)
        return -1;
    *out = k;
    return 0;
}

static int parse_pci(const char *s, unsigned *dom, unsigned *bus, unsigned *dev, unsigned *fn)
{
    char tail;
    if (!s || sscanf(s, "%x:%x:%x.%x%c", dom, bus, dev, fn, &tail) != 4)
        return -1;
    return 0;
}

static int parse_device_line(fdev_t *d, const char *key, char **p, perr_t *pe)
{
    char *v;
    if (strcmp(key, "uuid") == 0) {
        if (copy_str(d->uuid, next_tok(p)))
            return fail(pe, "bad uuid", NULL);
    } else if (strcmp(key, "name") == 0) {
        if (copy_str(d->name, rest_of_line(p)))
            return fail(pe, "bad name", NULL);
    } else if (strcmp(key, "serial") == 0) {
        if (copy_str(d->serial, next_tok(p)))
            return fail(pe, "bad serial", NULL);
    } else if (strcmp(key, "minor") == 0) {
        if (parse_uint(next_tok(p), &d->minor))
            return fail(pe, "bad minor", NULL);
    } else if (strcmp(key, "pci_bus_id") == 0) {
        unsigned a, b, c, e;
        v = next_tok(p);
        if (parse_pci(v, &a, &b, &c, &e) || copy_str(d->pci, v))
            return fail(pe, "bad pci_bus_id (want DDDDDDDD:BB:DD.F)", NULL);
    } else if (strcmp(key, "pci_device_id") == 0) {
        if (parse_uint(next_tok(p), &d->pci_device_id))
            return fail(pe, "bad pci_device_id", NULL);
    } else if (strcmp(key, "pci_subsystem_id") == 0) {
        if (parse_uint(next_tok(p), &d->pci_subsystem_id))
            return fail(pe, "bad pci_subsystem_id", NULL);
    } else if (strcmp(key, "memory_total") == 0) {
        if (parse_ull(next_tok(p), &d->mem_total))
            return fail(pe, "bad memory_total", NULL);
    } else if (strcmp(key, "memory_reserved") == 0) {
        if (parse_ull(next_tok(p), &d->mem_reserved))
            return fail(pe, "bad memory_reserved", NULL);
    } else if (strcmp(key, "memory_used") == 0) {
        v = next_tok(p);
        unsigned long long u;
        if (v && strcmp(v, "auto") == 0)
            d->mem_used = -1;
        else if (parse_ull(v, &u) || u > (unsigned long long)LLONG_MAX)
            return fail(pe, "bad memory_used (bytes or 'auto')", NULL);
        else
            d->mem_used = (long long)u;
    } else if (strcmp(key, "power_w") == 0) {
        if (parse_dbl(next_tok(p), &d->power_w) || d->power_w < 0 || d->power_w > 1e6)
            return fail(pe, "bad power_w (0..1e6)", NULL);
    } else if (strcmp(key, "energy") == 0) {
        if (parse_dbl(next_tok(p), &d->energy_base_mj) || d->energy_base_mj < 0 ||
            d->energy_base_mj > 1e18 || parse_dbl(next_tok(p), &d->energy_origin))
            return fail(pe, "energy needs BASE_MJ ORIGIN", NULL);
    } else if (strcmp(key, "temperature") == 0) {
        long long t;
        if (parse_ll(next_tok(p), &t) || t < -273 || t > 1000)
            return fail(pe, "bad temperature", NULL);
        d->temp = (int)t;
    } else if (strcmp(key, "ecc") == 0) {
        if (parse_ull(next_tok(p), &d->ecc_c) || parse_ull(next_tok(p), &d->ecc_u))
            return fail(pe, "ecc needs CORRECTED UNCORRECTED", NULL);
    } else if (strcmp(key, "mig_on") == 0) {
        unsigned m;
        if (parse_uint(next_tok(p), &m) || m > 1)
            return fail(pe, "mig_on must be 0 or 1", NULL);
        d->mig_on = (int)m;
    } else if (strcmp(key, "lost") == 0) {
        unsigned l;
        if (parse_uint(next_tok(p), &l) || l > 1)
            return fail(pe, "lost must be 0 or 1", NULL);
        d->lost = (int)l;
    } else if (strcmp(key, "util") == 0) {
        return parse_trace(p, &d->util, 100, pe);
    } else if (strcmp(key, "process") == 0) {
        proc_t pr;
        memset(&pr, 0, sizeof pr);
        if (parse_uint(next_tok(p), &pr.pid) || parse_kinds(next_tok(p), &pr.kinds) ||
            parse_ull(next_tok(p), &pr.mem) || parse_id(next_tok(p), &pr.gi) ||
            parse_id(next_tok(p), &pr.ci))
            return fail(pe, "process needs PID KIND MEMORY GI CI", NULL);
        pr.sm_scale = 1.0;
        if (grow((void **)&d->procs, &d->capproc, d->nproc, sizeof(proc_t)))
            return fail(pe, "out of memory", NULL);
        d->procs[d->nproc++] = pr;
    } else if (strcmp(key, "psm_scale") == 0) {
        double f;
        if (!d->nproc)
            return fail(pe, "psm_scale before any process line", NULL);
        if (parse_dbl(next_tok(p), &f) || !(f > 0) || f > 10)
            return fail(pe, "bad psm_scale (want 0 < FACTOR <= 10)", NULL);
        d->procs[d->nproc - 1].sm_scale = f;
    } else if (strcmp(key, "pgarbage") == 0) {
        unsigned g;
        if (!d->nproc)
            return fail(pe, "pgarbage before any process line", NULL);
        if (parse_uint(next_tok(p), &g))
            return fail(pe, "bad pgarbage (want EVERY_N_READS)", NULL);
        d->procs[d->nproc - 1].garbage = g;
    } else if (strcmp(key, "psm") == 0) {
        if (!d->nproc)
            return fail(pe, "psm before any process line", NULL);
        return parse_trace(p, &d->procs[d->nproc - 1].sm, 100, pe);
    } else if (strcmp(key, "mig") == 0) {
        if (d->nmig >= MAX_MIG)
            return fail(pe, "too many mig lines (max 8)", NULL);
        mig_t *m = &d->mig[d->nmig];
        memset(m, 0, sizeof *m);
        if (parse_uint(next_tok(p), &m->gi) || parse_uint(next_tok(p), &m->ci) ||
            parse_ull(next_tok(p), &m->total) || parse_ull(next_tok(p), &m->used) ||
            copy_str(m->uuid, next_tok(p)) || copy_str(m->name, rest_of_line(p)) ||
            !m->name[0])
            return fail(pe, "mig needs GI CI MEMORY_TOTAL MEMORY_USED UUID NAME", NULL);
        d->nmig++;
    } else if (strcmp(key, "gpm_support") == 0) {
        unsigned g;
        if (parse_uint(next_tok(p), &g) || g > 1)
            return fail(pe, "gpm_support must be 0 or 1", NULL);
        d->gpm_support = (int)g;
    } else if (strcmp(key, "gpm") == 0) {
        unsigned gi, metric;
        if (parse_id(next_tok(p), &gi) || parse_uint(next_tok(p), &metric) ||
            !gpm_metric_info(metric))
            return fail(pe, "gpm needs GI|- METRIC (a supported NVML_GPM_METRIC_* id) and a trace",
                        NULL);
        gpmtl_t *g = NULL;
        for (int i = 0; i < d->ngpm; i++)
            if (d->gpm[i].gi == gi && d->gpm[i].metric == metric)
                g = &d->gpm[i];
        if (!g) {
            if (grow((void **)&d->gpm, &d->capgpm, d->ngpm, sizeof(gpmtl_t)))
                return fail(pe, "out of memory", NULL);
            g = &d->gpm[d->ngpm++];
            memset(g, 0, sizeof *g);
            g->gi = gi;
            g->metric = metric;
        }
        return parse_trace(p, &g->tl, gpm_metric_info(metric)->max, pe);
    } else if (strcmp(key, "xid") == 0) {
        xid_t x;
        if (parse_ll(next_tok(p), &x.seq) || parse_ull(next_tok(p), &x.xid) ||
            parse_dbl(next_tok(p), &x.time) || parse_id(next_tok(p), &x.gi) ||
            parse_id(next_tok(p), &x.ci))
            return fail(pe, "xid needs SEQ XID TIME GI CI", NULL);
        if (d->nxid && x.seq <= d->xids[d->nxid - 1].seq)
            return fail(pe, "xid SEQ must increase", NULL);
        if (grow((void **)&d->xids, &d->capxid, d->nxid, sizeof(xid_t)))
            return fail(pe, "out of memory", NULL);
        d->xids[d->nxid++] = x;
    } else if (strcmp(key, "violation") == 0) {
        unsigned pol;
        double base, origin, frac;
        if (parse_uint(next_tok(p), &pol) || pol >= MAX_POLICY || (pol > 5 && pol < 10) ||
            parse_dbl(next_tok(p), &base) || base < 0 || base > 1e19 ||
            parse_dbl(next_tok(p), &origin) || parse_dbl(next_tok(p), &frac) || frac < 0 ||
            frac > 1)
            return fail(pe, "violation needs POLICY (0..5, 10, 11) BASE_NS ORIGIN FRACTION (0..1)",
                        NULL);
        d->viol_on[pol] = 1;
        d->viol_base_ns[pol] = base;
        d->viol_origin[pol] = origin;
        d->viol_fraction[pol] = frac;
    } else if (strcmp(key, "sm_clock") == 0) {
        if (parse_uint(next_tok(p), &d->sm_clock) || parse_uint(next_tok(p), &d->sm_clock_max))
            return fail(pe, "sm_clock needs MHZ MAX_MHZ", NULL);
        d->sm_clock_set = 1;
    } else if (strcmp(key, "remapped_rows") == 0) {
        for (int i = 0; i < 4; i++)
            if (parse_uint(next_tok(p), &d->remap[i]))
                return fail(pe, "remapped_rows needs CORRECTABLE UNCORRECTABLE PENDING FAILURE",
                            NULL);
        d->remap_set = 1;
    } else if (strcmp(key, "pcie_replays") == 0) {
        if (parse_uint(next_tok(p), &d->pcie_replays))
            return fail(pe, "bad pcie_replays", NULL);
        d->pcie_set = 1;
    } else if (strcmp(key, "nvlink") == 0) {
        unsigned link;
        if (parse_uint(next_tok(p), &link) || link >= MAX_LINKS)
            return fail(pe, "nvlink needs LINK (0..17) REPLAY RECOVERY CRC_FLIT CRC_DATA", NULL);
        for (int i = 0; i < 4; i++)
            if (parse_ull(next_tok(p), &d->nvlink_err[link][i]))
                return fail(pe, "nvlink needs LINK REPLAY RECOVERY CRC_FLIT CRC_DATA", NULL);
        d->nvlink_on[link] = d->nvlink_any = 1;
    } else if (strcmp(key, "error") == 0 || strcmp(key, "error_once") == 0) {
        return parse_inject(p, &d->errors, 0, pe, key[5] == '_');
    } else if (strcmp(key, "sleep") == 0) {
        return parse_inject(p, &d->sleeps, 1, pe, 0);
    } else {
        return fail(pe, "unknown device key '%s'", key);
    }
    if (next_tok(p))
        return fail(pe, "trailing text after '%s'", key);
    return 0;
}

static int parse_global_line(state_t *st, const char *key, char **p, perr_t *pe)
{
    char *v;
    if (strcmp(key, "fakenvml") == 0) {
        v = next_tok(p);
        if (!v || strcmp(v, "1") != 0)
            return fail(pe, "unsupported format version (want 'fakenvml 1')", NULL);
    } else if (strcmp(key, "driver_version") == 0) {
        if (copy_str(st->driver, next_tok(p)))
            return fail(pe, "bad driver_version", NULL);
    } else if (strcmp(key, "nvml_version") == 0) {
        if (copy_str(st->nvml_version, next_tok(p)))
            return fail(pe, "bad nvml_version", NULL);
    } else if (strcmp(key, "cuda_driver_version") == 0) {
        long long c;
        if (parse_ll(next_tok(p), &c) || c < 0 || c > INT_MAX)
            return fail(pe, "bad cuda_driver_version", NULL);
        st->cuda_version = (int)c;
    } else if (strcmp(key, "sample_period_ms") == 0) {
        if (parse_uint(next_tok(p), &st->period_ms) || !st->period_ms || st->period_ms > 600000)
            return fail(pe, "bad sample_period_ms", NULL);
    } else if (strcmp(key, "buffer_samples") == 0) {
        if (parse_uint(next_tok(p), &st->buffer_samples) || !st->buffer_samples ||
            st->buffer_samples > 100000)
            return fail(pe, "bad buffer_samples", NULL);
    } else if (strcmp(key, "process_util_mode") == 0) {
        v = next_tok(p);
        if (v && strcmp(v, "grid") == 0)
            st->proc_latest = 0;
        else if (v && strcmp(v, "latest") == 0)
            st->proc_latest = 1;
        else
            return fail(pe, "process_util_mode must be grid or latest", NULL);
    } else if (strcmp(key, "time_scale") == 0) {
        if (parse_dbl(next_tok(p), &st->time_scale) || st->time_scale <= 0 ||
            st->time_scale > 1e6)
            return fail(pe, "bad time_scale (want 0 < SCALE <= 1e6)", NULL);
        if (parse_dbl(next_tok(p), &st->time_origin) || st->time_origin < 0)
            return fail(pe, "bad time_scale origin (epoch seconds >= 0)", NULL);
    } else if (strcmp(key, "process_zero_samples") == 0) {
        unsigned z;
        if (parse_uint(next_tok(p), &z) || z > 1)
            return fail(pe, "process_zero_samples must be 0 or 1", NULL);
        st->zero_samples = (int)z;
    } else if (strcmp(key, "init_error") == 0) {
        v = next_tok(p);
        if (!v || (strcmp(v, "none") != 0 && parse_error_name(v, &st->init_error)))
            return fail(pe, "bad init_error", NULL);
        if (strcmp(v, "none") == 0)
            st->init_error = NVML_SUCCESS;
    } else if (strcmp(key, "error") == 0 || strcmp(key, "error_once") == 0) {
        return parse_inject(p, &st->errors, 0, pe, key[5] == '_');
    } else if (strcmp(key, "sleep") == 0) {
        return parse_inject(p, &st->sleeps, 1, pe, 0);
    } else if (strcmp(key, "sample_jitter") == 0) {
        unsigned long long every;
        if (parse_dbl(next_tok(p), &st->jitter) || st->jitter < 0 || st->jitter > 0.9 ||
            parse_ull(next_tok(p), &every) || every == 1 || every > 1000000)
            return fail(pe, "bad sample_jitter (want 0 <= FRACTION <= 0.9, EVERY 0 or >= 2)",
                        NULL);
        st->miss_every = (unsigned)every;
    } else if (strcmp(key, "clock_offset") == 0) {
        if (parse_dbl(next_tok(p), &st->clock_offset) || fabs(st->clock_offset) > 1e10)
            return fail(pe, "bad clock_offset (seconds)", NULL);
    } else if (strcmp(key, "device_clock") == 0 || strcmp(key, "process_clock") == 0) {
        int *boot = key[0] == 'd' ? &st->device_boot : &st->process_boot;
        v = next_tok(p);
        if (v && strcmp(v, "epoch") == 0)
            *boot = 0;
        else if (v && strcmp(v, "boot") == 0)
            *boot = 1;
        else
            return fail(pe, "%s must be epoch or boot", key);
    } else if (strcmp(key, "boot_time") == 0) {
        v = next_tok(p);
        if (v && strcmp(v, "host") == 0)
            st->boot_time_set = 0;
        else if (v && !parse_dbl(v, &st->boot_time) && st->boot_time >= 0 && st->boot_time < 1e11)
            st->boot_time_set = 1;
        else
            return fail(pe, "bad boot_time (epoch seconds or 'host')", NULL);
    } else if (strcmp(key, "idle_samples") == 0) {
        unsigned z;
        if (parse_uint(next_tok(p), &z) || z > 1)
            return fail(pe, "idle_samples must be 0 or 1", NULL);
        st->idle_dry = !z;
    } else if (strcmp(key, "process_stagger") == 0) {
        if (parse_dbl(next_tok(p), &st->stagger_s) || st->stagger_s < 0 || st->stagger_s > 3600)
            return fail(pe, "bad process_stagger (seconds, 0..3600)", NULL);
    } else if (strcmp(key, "energy_step_ms") == 0) {
        if (parse_dbl(next_tok(p), &st->energy_step_ms) || st->energy_step_ms < 0 ||
            st->energy_step_ms > 3600000)
            return fail(pe, "bad energy_step_ms (0..3600000)", NULL);
    } else {
        return fail(pe, "unknown key '%s'", key);
    }
    if (next_tok(p))
        return fail(pe, "trailing text after '%s'", key);
    return 0;
}

static int validate(state_t *st, perr_t *pe)
{
    for (int i = 0; i < MAX_DEV; i++) {
        fdev_t *d = &st->dev[i];
        if (!d->present)
            continue;
        if (!d->uuid[0])
            return fail(pe, "a device has no uuid", NULL);
        for (int j = 0; j < MAX_DEV; j++)
            if (j != i && st->dev[j].present && strcmp(st->dev[j].uuid, d->uuid) == 0)
                return fail(pe, "duplicate uuid %s", d->uuid);
    }
    return 0;
}

/* Parse a whole state file; NULL (and pe filled) on error. */
static state_t *parse_state(const char *path, perr_t *pe)
{
    pe->path = path;
    pe->line = 0;
    pe->msg[0] = '\0';
    FILE *f = fopen(path, "rb");
    if (!f) {
        fail(pe, "cannot open: %s", strerror(errno));
        return NULL;
    }
    char *buf = malloc(MAX_FILE + 1);
    size_t len = buf ? fread(buf, 1, MAX_FILE + 1, f) : 0;
    int rerr = ferror(f);
    fclose(f);
    if (!buf || rerr || len > MAX_FILE) {
        free(buf);
        fail(pe, "cannot read (or larger than 64 MiB)", NULL);
        return NULL;
    }
    buf[len] = '\0';

    state_t *st = calloc(1, sizeof *st);
    if (!st) {
        free(buf);
        fail(pe, "out of memory", NULL);
        return NULL;
    }
    strcpy(st->driver, "550.54.15");
    st->cuda_version = 12040;
    st->period_ms = 167;
    st->buffer_samples = 120;
    st->time_scale = 1.0;

    fdev_t *cur = NULL;
    int ok = 0, saw_header = 0;
    char *line = buf;
    while (line && *line) {
        char *nl = strchr(line, '\n');
        if (nl)
            *nl = '\0';
        pe->line++;
        char *cr = strchr(line, '\r');
        if (cr)
            *cr = '\0';
        char *p = line;
        line = nl ? nl + 1 : NULL;
        char *key = next_tok(&p);
        if (!key || key[0] == '#')
            continue;
        if (!saw_header) {
            if (strcmp(key, "fakenvml") != 0) {
                fail(pe, "first line must be 'fakenvml 1'", NULL);
                goto out;
            }
            saw_header = 1;
        }
        if (strcmp(key, "device") == 0) {
            unsigned idx;
            if (parse_uint(next_tok(&p), &idx) || idx >= MAX_DEV || next_tok(&p)) {
                fail(pe, "device needs an index below 64", NULL);
                goto out;
            }
            if (st->dev[idx].present) {
                fail(pe, "duplicate device index", NULL);
                goto out;
            }
            cur = &st->dev[idx];
            cur->present = 1;
            cur->index = idx;
            cur->minor = idx;
            cur->mem_used = -1;
            cur->temp = 35;
            cur->pci_device_id = 0x20B210DEu;
            cur->pci_subsystem_id = 0x147F10DEu;
            snprintf(cur->name, STR_LEN, "NVIDIA A100-SXM4-80GB");
            snprintf(cur->serial, STR_LEN, "16500%08u", idx);
            snprintf(cur->pci, STR_LEN, "00000000:%02X:00.0", 0x10 + idx);
            st->ndev++;
            continue;
        }
        if (strcmp(key, "end") == 0) {
            cur = NULL;
            continue;
        }
        int r = cur ? parse_device_line(cur, key, &p, pe) : parse_global_line(st, key, &p, pe);
        if (r)
            goto out;
    }
    if (!saw_header) {
        pe->line = 0;
        fail(pe, "empty state (first line must be 'fakenvml 1')", NULL);
        goto out;
    }
    pe->line = 0;
    if (validate(st, pe))
        goto out;
    if (!st->nvml_version[0])
        snprintf(st->nvml_version, STR_LEN, "12.%.120s", st->driver);
    ok = 1;
out:
    free(buf);
    if (!ok) {
        free_state(st);
        return NULL;
    }
    return st;
}

static int same_file(const struct stat *a, const struct stat *b)
{
    return a->st_dev == b->st_dev && a->st_ino == b->st_ino && a->st_size == b->st_size &&
           a->st_mtim.tv_sec == b->st_mtim.tv_sec && a->st_mtim.tv_nsec == b->st_mtim.tv_nsec;
}

/* With g_lock held: make g_state match the file.  One stat() when nothing
 * changed.  Returns NVML_SUCCESS, or the error every call should give while
 * the file is missing (missing_err) or malformed (NVML_ERROR_UNKNOWN). */
static nvmlReturn_t refresh_state(nvmlReturn_t missing_err)
{
    const char *path = getenv("FAKE_NVML_STATE");
    struct stat sb;
    if (!path || !*path) {
        if (!g_warned_unset)
            fprintf(stderr, "fake-nvml: FAKE_NVML_STATE is not set\n");
        g_warned_unset = 1;
        return missing_err;
    }
    if (stat(path, &sb) != 0) {
        struct stat none;
        memset(&none, 0, sizeof none);
        none.st_ino = 1; /* marks "missing" without matching a real file */
        none.st_size = -1;
        if (!g_have_bad || !same_file(&g_bad_st, &none)) {
            fprintf(stderr, "fake-nvml: %s: %s\n", path, strerror(errno));
            g_bad_st = none;
            g_have_bad = 1;
        }
        return missing_err;
    }
    if (g_state && g_have_loaded && same_file(&sb, &g_loaded_st)) {
        g_have_bad = 0;
        return NVML_SUCCESS;
    }
    if (g_have_bad && same_file(&sb, &g_bad_st))
        return NVML_ERROR_UNKNOWN;
    perr_t pe;
    state_t *st = parse_state(path, &pe);
    if (!st) {
        if (pe.line)
            fprintf(stderr, "fake-nvml: %s:%d: %s\n", path, pe.line, pe.msg);
        else
            fprintf(stderr, "fake-nvml: %s: %s\n", path, pe.msg);
        g_bad_st = sb;
        g_have_bad = 1;
        return NVML_ERROR_UNKNOWN;
    }
    free_state(g_state);
    g_state = st;
    g_loaded_st = sb;
    g_have_loaded = 1;
    g_have_bad = 0;
    return NVML_SUCCESS;
}

/* ------------------------------------------------------------------- time */

/* The real wall clock, which the fake clock is made from. */
static double real_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Seconds on CLOCK_MONOTONIC: for timeouts, which never scale, and which a step
 * of the wall clock must not stretch or cut short. */
static double elapsed_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* The fake clock (g_state loaded, lock held): every timestamp, pattern and
 * energy value the library reports runs on it.  With time_scale S and origin
 * O it reads O + (real - O) * S, so S = 10 makes ten seconds pass per real
 * second; S = 1 is the real clock. */
static double now_s(void)
{
    double real = real_now_s();
    if (!g_state || g_state->time_scale == 1.0)
        return real;
    return g_state->time_origin + (real - g_state->time_origin) * g_state->time_scale;
}

static unsigned long long now_us(void)
{
    if (g_state && g_state->time_scale != 1.0) {
        double t = now_s();
        return t > 0 ? (unsigned long long)(t * 1e6) : 0ull;
    }
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (unsigned long long)ts.tv_sec * 1000000ull + (unsigned long long)ts.tv_nsec / 1000ull;
}

static void sleep_s(double s)
{
    if (s <= 0)
        return;
    struct timespec ts;
    ts.tv_sec = (time_t)s;
    ts.tv_nsec = (long)((s - (double)ts.tv_sec) * 1e9);
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

/* ------------------------------------------------------- pattern algebra */

#define TEPS 1e-6 /* boundaries closer than 1 us are merged */

static double trace_value(const trace_t *tr, double t)
{
    if (tr->derived)
        return 0;
    double u = t - tr->origin;
    if (tr->repeat)
        u -= floor(u / tr->period) * tr->period;
    else if (u < 0 || u >= tr->period)
        return 0;
    double c = 0;
    for (int i = 0; i < tr->nseg; i++) {
        c += tr->segs[i].dur;
        if (u < c)
            return tr->segs[i].pct;
    }
    return tr->segs[tr->nseg - 1].pct;
}

/* Next instant after t where the trace's value may change. */
static double trace_next(const trace_t *tr, double t)
{
    if (tr->derived)
        return INFINITY;
    double base;
    if (tr->repeat) {
        base = tr->origin + floor((t - tr->origin) / tr->period) * tr->period;
    } else {
        if (t < tr->origin - TEPS)
            return tr->origin;
        if (t >= tr->origin + tr->period - TEPS)
            return INFINITY;
        base = tr->origin;
    }
    for (int cyc = 0; cyc < 3; cyc++) {
        double c = base + cyc * tr->period;
        for (int i = 0; i < tr->nseg; i++) {
            c += tr->segs[i].dur;
            if (c > t + TEPS)
                return c;
        }
        if (!tr->repeat)
            return INFINITY;
    }
    return t + tr->period;
}

/* The trace in effect at t, or NULL before the first one. */
static const trace_t *tl_at(const tracelist_t *tl, double t)
{
    const trace_t *cur = NULL;
    for (int i = 0; i < tl->n && tl->v[i].from <= t; i++)
        cur = &tl->v[i];
    return cur;
}

static double tl_value(const tracelist_t *tl, double t)
{
    const trace_t *tr = tl_at(tl, t);
    return tr ? trace_value(tr, t) : 0;
}

static double tl_next(const tracelist_t *tl, double t)
{
    double n = INFINITY;
    const trace_t *tr = tl_at(tl, t);
    if (tr)
        n = trace_next(tr, t);
    for (int i = 0; i < tl->n; i++)
        if (tl->v[i].from > t + TEPS) {
            n = fmin(n, tl->v[i].from);
            break;
        }
    return n;
}

static int has_samples(const tracelist_t *tl)
{
    for (int i = 0; i < tl->n; i++)
        if (!tl->v[i].derived)
            return 1;
    return 0;
}

static double dev_value(const fdev_t *d, double t)
{
    const trace_t *tr = tl_at(&d->util, t);
    if (tr && !tr->derived)
        return trace_value(tr, t);
    double s = 0;
    for (int i = 0; i < d->nproc; i++)
        s += tl_value(&d->procs[i].sm, t);
    return fmin(100.0, s);
}

static double dev_next(const fdev_t *d, double t)
{
    double n = tl_next(&d->util, t);
    const trace_t *tr = tl_at(&d->util, t);
    if (!tr || tr->derived)
        for (int i = 0; i < d->nproc; i++)
            n = fmin(n, tl_next(&d->procs[i].sm, t));
    return n;
}

/* Exact mean over (a, b] of a piecewise-constant signal: walk from change
 * to change and take the value in the middle of each piece. */
static double mean_dev(const fdev_t *d, const tracelist_t *tl, double a, double b)
{
    double acc = 0, t = a;
    for (int guard = 0; t < b && guard < 10000000; guard++) {
        double n = fmin(b, d ? dev_next(d, t) : tl_next(tl, t));
        if (!(n > t))
            n = fmin(b, t + TEPS);
        double mid = 0.5 * (t + n);
        acc += (d ? dev_value(d, mid) : tl_value(tl, mid)) * (n - t);
        t = n;
    }
    return b > a ? acc / (b - a) : 0;
}

static unsigned pct_round(double v)
{
    long r = lround(v);
    return r < 0 ? 0u : r > 100 ? 100u : (unsigned)r;
}

/* Range of process sample indices k (t_k = k * period, stamped on the grid)
 * that a query with lastSeenTimeStamp may return: the newest complete one and
 * those of the newest buffer_samples periods (a time window; device samples
 * keep a ring instead, see device_ring()).  Returns 0 when there is none. */
static int sample_range(const state_t *st, unsigned long long last_seen, unsigned long long now,
                        unsigned long long *k_lo, unsigned long long *k_hi)
{
    unsigned long long per = (unsigned long long)st->period_ms * 1000ull;
    unsigned long long hi = now / per;
    unsigned long long lo = hi >= st->buffer_samples ? hi - st->buffer_samples + 1 : 0;
    unsigned long long after = last_seen / per + 1;
    if (after > lo)
        lo = after;
    *k_lo = lo;
    *k_hi = hi;
    return lo <= hi;
}

static double k_time(const state_t *st, unsigned long long k)
{
    return (double)k * (double)st->period_ms / 1000.0;
}

/* Device sample k is taken up to `jitter` of a period after k * period, and
 * about one in `miss_every` is missing (never two in a row), as real drivers
 * do; each sample covers the time since the previous one taken. */
static unsigned long long mix(unsigned long long k)
{
    k += 0x9E3779B97F4A7C15ull;
    k = (k ^ (k >> 30)) * 0xBF58476D1CE4E5B9ull;
    k = (k ^ (k >> 27)) * 0x94D049BB133111EBull;
    return k ^ (k >> 31);
}

static int sample_missing(const state_t *st, unsigned long long k)
{
    if (!st->miss_every || k == 0)
        return 0;
    return mix(k) % st->miss_every == 0 && mix(k - 1) % st->miss_every != 0;
}

static unsigned long long sample_us(const state_t *st, unsigned long long k)
{
    unsigned long long per = (unsigned long long)st->period_ms * 1000ull;
    unsigned long long late = st->jitter > 0 ? mix(~k) % (unsigned long long)(st->jitter * per + 1)
                                             : 0;
    return k * per + late;
}

/* The host's boot time on the wall clock (realtime - boottime), measured once
 * per load of the library.  It only places CLOCK_BOOTTIME on the epoch, where
 * the patterns are, for the calls stamped on the boot clock: those read
 * CLOCK_BOOTTIME itself (boot_now_us()), so a later step of the wall clock
 * moves none of their stamps, as with a driver.  Once per load: a driver stores
 * each sample's timestamp, so two reads of one sample agree to the microsecond;
 * measured per call, the gap between the two clock reads (under a microsecond
 * with a vDSO clock source, more through a system call or when preempted
 * between them) made a re-read sample 1 us older now and then, which an agent
 * takes for its clock going back.  The tightest of a few bracketed reads is
 * kept. */
static double g_host_boot_s;
static int g_host_boot_known;

static double host_boot_epoch_s(void)
{
    if (g_host_boot_known)
        return g_host_boot_s;
    double best_width = 1e9;
    for (int i = 0; i < 8; i++) {
        struct timespec r0, bt, r1;
        clock_gettime(CLOCK_REALTIME, &r0);
        clock_gettime(CLOCK_BOOTTIME, &bt);
        clock_gettime(CLOCK_REALTIME, &r1);
        double a = (double)r0.tv_sec + (double)r0.tv_nsec * 1e-9;
        double b = (double)r1.tv_sec + (double)r1.tv_nsec * 1e-9;
        double boot = (double)bt.tv_sec + (double)bt.tv_nsec * 1e-9;
        if (b - a < best_width) {
            best_width = b - a;
            /* whole microseconds: timestamps shifted by it stay whole */
            g_host_boot_s = floor((0.5 * (a + b) - boot) * 1e6) / 1e6;
        }
    }
    g_host_boot_known = 1;
    return g_host_boot_s;
}

/* Seconds to take off the fake clock for a sample stamped on the boot clock:
 * the fake time of boot (boot_time), else the host's. */
static double boot_epoch_s(void)
{
    if (g_state->boot_time_set)
        return g_state->boot_time;
    return host_boot_epoch_s();
}

/* The fake clock (us) as a call stamped on the boot clock sees it: CLOCK_BOOTTIME
 * read directly, placed on the epoch by the host's boot time of this load, and
 * sped up by time_scale.  It runs with CLOCK_BOOTTIME whatever the wall clock
 * does: with the host's boot (boot_time host) and time scale 1 a stamp
 * (this less the boot time) is CLOCK_BOOTTIME; with boot_time T the boot clock
 * restarted at T but runs on as CLOCK_BOOTTIME does.  Without a step of the wall
 * clock since the load it reads as now_us(). */
static unsigned long long boot_now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_BOOTTIME, &ts);
    double host_boot = host_boot_epoch_s(); /* whole microseconds */
    if (g_state && g_state->time_scale != 1.0) {
        double t = (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9 + host_boot;
        t = g_state->time_origin + (t - g_state->time_origin) * g_state->time_scale;
        return t > 0 ? (unsigned long long)(t * 1e6) : 0ull;
    }
    long long us = (long long)ts.tv_sec * 1000000ll + (long long)ts.tv_nsec / 1000ll +
                   llround(host_boot * 1e6);
    return us > 0 ? (unsigned long long)us : 0ull;
}

/* The fake clock (us) of a call stamped on the boot clock (boot) or the epoch. */
static unsigned long long stamp_now_us(int boot)
{
    return boot ? boot_now_us() : now_us();
}

/* Driver timestamps: the fake clock (less the boot time for a call stamped on
 * the boot clock) plus clock_offset, never below 0.  A call takes the shift
 * once, so its conversions agree with each other. */
static double driver_shift_us(int boot)
{
    return g_state->clock_offset * 1e6 - (boot ? boot_epoch_s() * 1e6 : 0.0);
}

static unsigned long long to_driver_us(unsigned long long us, double shift)
{
    double v = (double)us + shift;
    return v > 0 ? (unsigned long long)v : 0ull;
}

static unsigned long long from_driver_us(unsigned long long us, double shift)
{
    if (us == 0)
        return 0; /* "everything in the buffer" */
    /* Up, not down: to_driver_us() truncated, so with a shift that is not a whole
     * microsecond a stamp taken back comes out 1 us early, and the sample it
     * stamps would be newer than itself. */
    double v = ceil((double)us - shift);
    return v > 0 ? (unsigned long long)v : 1ull;
}

/* --------------------------------------------------------- call plumbing */

typedef struct {
    fdev_t *dev;   /* parent device */
    mig_t *mig;    /* MIG device, or NULL for a parent handle */
    int slot, mig_index;
} target_t;

/* Handle lookups are not covered by "*": a device whose queries all fail
 * can still be enumerated ("lost" models one that cannot). */
static int star_applies(const char *fn)
{
    return strcmp(fn, "nvmlDeviceGetHandleByIndex_v2") != 0 &&
           strcmp(fn, "nvmlDeviceGetHandleByUUID") != 0;
}

static const inject_t *find_inject(const injlist_t *l, const char *fn)
{
    /* Exact name first, then without a _vN suffix (so "nvmlDeviceGetMemoryInfo"
     * also covers nvmlDeviceGetMemoryInfo_v2), then "*". */
    for (int i = 0; i < l->n; i++)
        if (strcmp(l->v[i].fn, fn) == 0 && !(l->v[i].once && l->v[i].used))
            return &l->v[i];
    const char *us = strrchr(fn, '_');
    if (us && us[1] == 'v' && us[2] >= '0' && us[2] <= '9') {
        size_t n = (size_t)(us - fn);
        for (int i = 0; i < l->n; i++)
            if (strlen(l->v[i].fn) == n && strncmp(l->v[i].fn, fn, n) == 0 &&
                !(l->v[i].once && l->v[i].used))
                return &l->v[i];
    }
    if (star_applies(fn))
        for (int i = 0; i < l->n; i++)
            if (strcmp(l->v[i].fn, "*") == 0 && !(l->v[i].once && l->v[i].used))
                return &l->v[i];
    return NULL;
}

static double sleep_for(const fdev_t *d, const char *fn)
{
    const inject_t *in = find_inject(&g_state->sleeps, fn);
    double s = in ? in->secs : 0;
    if (d && (in = find_inject(&d->sleeps, fn)) != NULL)
        s += in->secs;
    return s;
}

static nvmlReturn_t error_for(const fdev_t *d, const char *fn)
{
    inject_t *in = (inject_t *)find_inject(&g_state->errors, fn);
    if (!in && d)
        in = (inject_t *)find_inject(&d->errors, fn);
    if (!in)
        return NVML_SUCCESS;
    in->used = 1; /* spends an error_once until the state file changes */
    return in->err;
}

/* Locks; checks init; reloads the state; honours injected sleeps (without
 * holding the lock, so a hung call in one thread does not stall another)
 * and errors.  On NVML_SUCCESS the lock is held and must be released with
 * done(). */
static nvmlReturn_t begin(const char *fn)
{
    pthread_mutex_lock(&g_lock);
    if (g_refcount == 0) {
        pthread_mutex_unlock(&g_lock);
        return NVML_ERROR_UNINITIALIZED;
    }
    nvmlReturn_t r = refresh_state(NVML_ERROR_UNKNOWN);
    if (r == NVML_SUCCESS) {
        double s = sleep_for(NULL, fn);
        if (s > 0) {
            pthread_mutex_unlock(&g_lock);
            sleep_s(s);
            pthread_mutex_lock(&g_lock);
            r = g_refcount ? refresh_state(NVML_ERROR_UNKNOWN) : NVML_ERROR_UNINITIALIZED;
        }
    }
    if (r == NVML_SUCCESS)
        r = error_for(NULL, fn);
    if (r != NVML_SUCCESS)
        pthread_mutex_unlock(&g_lock);
    return r;
}

static nvmlReturn_t done(nvmlReturn_t r)
{
    pthread_mutex_unlock(&g_lock);
    return r;
}

/* Decode a handle without trusting it: it must point into our tables. */
static int decode_handle(nvmlDevice_t h, int *slot, int *mig)
{
    uintptr_t a = (uintptr_t)h;
    uintptr_t p0 = (uintptr_t)&g_parent[0], p1 = (uintptr_t)&g_parent[MAX_DEV];
    uintptr_t m0 = (uintptr_t)&g_mig[0][0], m1 = (uintptr_t)&g_mig[MAX_DEV - 1][MAX_MIG];
    if (a >= p0 && a < p1 && (a - p0) % sizeof(struct nvmlDevice_st) == 0) {
        *slot = (int)((a - p0) / sizeof(struct nvmlDevice_st));
        *mig = -1;
        return 0;
    }
    if (a >= m0 && a < m1 && (a - m0) % sizeof(struct nvmlDevice_st) == 0) {
        size_t i = (a - m0) / sizeof(struct nvmlDevice_st);
        *slot = (int)(i / MAX_MIG);
        *mig = (int)(i % MAX_MIG);
        return 0;
    }
    return -1;
}

/* Resolve a handle against the current state (lock held). */
static nvmlReturn_t resolve(nvmlDevice_t h, target_t *t)
{
    int slot, mig;
    if (decode_handle(h, &slot, &mig))
        return NVML_ERROR_INVALID_ARGUMENT;
    fdev_t *d = &g_state->dev[slot];
    if (!d->present)
        return NVML_ERROR_GPU_IS_LOST; /* the GPU vanished from the state */
    t->dev = d;
    t->slot = slot;
    t->mig_index = mig;
    t->mig = NULL;
    if (mig >= 0) {
        if (mig >= d->nmig)
            return NVML_ERROR_INVALID_ARGUMENT; /* that MIG device is gone */
        t->mig = &d->mig[mig];
    }
    return NVML_SUCCESS;
}

enum { PARENT_ONLY = 0, MIG_OK = 1 };

/* begin() for calls on a device handle: also sleeps/errors of the device,
 * GPU_IS_LOST for lost devices, NOT_SUPPORTED for MIG handles unless the
 * call works on them. */
static nvmlReturn_t begin_dev(const char *fn, nvmlDevice_t h, int mig_ok, target_t *t)
{
    nvmlReturn_t r = begin(fn);
    if (r != NVML_SUCCESS)
        return r;
    r = resolve(h, t);
    if (r == NVML_SUCCESS) {
        double s = sleep_for(t->dev, fn) - sleep_for(NULL, fn);
        if (s > 0) {
            pthread_mutex_unlock(&g_lock);
            sleep_s(s);
            pthread_mutex_lock(&g_lock);
            r = g_refcount ? refresh_state(NVML_ERROR_UNKNOWN) : NVML_ERROR_UNINITIALIZED;
            if (r == NVML_SUCCESS)
                r = resolve(h, t);
        }
    }
    if (r == NVML_SUCCESS && t->dev->lost)
        r = NVML_ERROR_GPU_IS_LOST;
    if (r == NVML_SUCCESS)
        r = error_for(t->dev, fn);
    if (r == NVML_SUCCESS && t->mig && !mig_ok)
        r = NVML_ERROR_NOT_SUPPORTED;
    if (r != NVML_SUCCESS)
        pthread_mutex_unlock(&g_lock);
    return r;
}

static nvmlReturn_t put_str(char *dst, unsigned len, const char *src)
{
    if (!dst)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(src) + 1 > len)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    strcpy(dst, src);
    return NVML_SUCCESS;
}

/* ------------------------------------------------------------ init, system */

nvmlReturn_t nvmlInitWithFlags(unsigned int flags)
{
    (void)flags;
    pthread_once(&g_once, init_tables);
    pthread_mutex_lock(&g_lock);
    nvmlReturn_t r = refresh_state(NVML_ERROR_DRIVER_NOT_LOADED);
    if (r == NVML_SUCCESS && g_state->init_error != NVML_SUCCESS)
        r = g_state->init_error;
    if (r == NVML_SUCCESS)
        r = error_for(NULL, "nvmlInitWithFlags");
    if (r == NVML_SUCCESS)
        g_refcount++;
    pthread_mutex_unlock(&g_lock);
    return r;
}

nvmlReturn_t nvmlInit_v2(void)
{
    return nvmlInitWithFlags(0);
}

nvmlReturn_t nvmlShutdown(void)
{
    pthread_mutex_lock(&g_lock);
    nvmlReturn_t r = NVML_ERROR_UNINITIALIZED;
    if (g_refcount > 0) {
        g_refcount--;
        r = NVML_SUCCESS;
    }
    pthread_mutex_unlock(&g_lock);
    return r;
}

nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length)
{
    nvmlReturn_t r = begin(__func__);
    if (r != NVML_SUCCESS)
        return r;
    return done(put_str(version, length, g_state->driver));
}

nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length)
{
    nvmlReturn_t r = begin(__func__);
    if (r != NVML_SUCCESS)
        return r;
    return done(put_str(version, length, g_state->nvml_version));
}

nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *cudaDriverVersion)
{
    nvmlReturn_t r = begin(__func__);
    if (r != NVML_SUCCESS)
        return r;
    if (!cudaDriverVersion)
        return done(NVML_ERROR_INVALID_ARGUMENT);
    *cudaDriverVersion = g_state->cuda_version;
    return done(NVML_SUCCESS);
}

nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *cudaDriverVersion)
{
    nvmlReturn_t r = begin(__func__);
    if (r != NVML_SUCCESS)
        return r;
    if (!cudaDriverVersion)
        return done(NVML_ERROR_INVALID_ARGUMENT);
    *cudaDriverVersion = g_state->cuda_version;
    return done(NVML_SUCCESS);
}

/* ------------------------------------------------------- device discovery */

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *deviceCount)
{
    nvmlReturn_t r = begin(__func__);
    if (r != NVML_SUCCESS)
        return r;
    if (!deviceCount)
        return done(NVML_ERROR_INVALID_ARGUMENT);
    *deviceCount = (unsigned)g_state->ndev;
    return done(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device)
{
    nvmlReturn_t r = begin(__func__);
    if (r != NVML_SUCCESS)
        return r;
    if (!device || index >= MAX_DEV || !g_state->dev[index].present)
        return done(NVML_ERROR_INVALID_ARGUMENT);
    fdev_t *d = &g_state->dev[index];
    if (d->lost)
        return done(NVML_ERROR_GPU_IS_LOST);
    r = error_for(d, __func__);
    if (r == NVML_SUCCESS)
        *device = &g_parent[index];
    return done(r);
}

nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device)
{
    nvmlReturn_t r = begin(__func__);
    if (r != NVML_SUCCESS)
        return r;
    if (!uuid || !device)
        return done(NVML_ERROR_INVALID_ARGUMENT);
    /* Documented: GPU_IS_LOST if *any* GPU has fallen off the bus. */
    for (int i = 0; i < MAX_DEV; i++)
        if (g_state->dev[i].present && g_state->dev[i].lost)
            return done(NVML_ERROR_GPU_IS_LOST);
    for (int i = 0; i < MAX_DEV; i++) {
        fdev_t *d = &g_state->dev[i];
        if (!d->present)
            continue;
        if (strcmp(d->uuid, uuid) == 0) {
            *device = &g_parent[i];
            return done(error_for(d, __func__));
        }
        for (int j = 0; j < d->nmig; j++)
            if (strcmp(d->mig[j].uuid, uuid) == 0) {
                *device = &g_mig[i][j];
                return done(error_for(d, __func__));
            }
    }
    return done(NVML_ERROR_NOT_FOUND);
}

nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index)
{
    target_t t;
    nvmlReturn_t r = begin_dev(__func__, device, PARENT_ONLY, &t);
    if (r != NVML_SUCCESS)
        return r;
    if (!index)
        return done(NVML_ERROR_INVALID_ARGUMENT);
    *index = t.dev->index;
    return done(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length)
{
    target_t t;
    nvmlReturn_t r = begin_dev(__func__, device, MIG_OK, &t);
    if (r != NVML_SUCCESS)
        return r;
    return done(put_str(uuid, length, t.mig ? t.mig->uuid : t.dev->uuid));
}

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length)
{
    target_t t;
    nvmlReturn_t r = begin_dev(__func__, device, MIG_OK, &t);
    if (r != NVML_SUCCESS)
        return r;
    return done(put_str(name, length, t.mig ? t.mig->name : t.dev->name));
}

nvmlReturn_t nvmlDeviceGetSerial(nvmlDevice_t device, char *serial, unsigned int length)
{
    target_t t;
    nvmlReturn_t r = begin_dev(__func__, device, PARENT_ONLY, &t);
    if (r != NVML_SUCCESS)
        return r;
    return done(put_str(serial, length, t.dev->serial));
}

nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t device, unsigned int *minorNumber)
{
    target_t t;
    nvmlReturn_t r = begin_dev(__func__, device, PARENT_ONLY, &t);
    if (r != NVML_SUCCESS)
        return r;
    if (!minorNumber)
        return done(NVML_ERROR_INVALID_ARGUMENT);
    *minorNumber = t.dev->minor;
    return done(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t *pci)
{
    target_t t;
    nvmlReturn_t r = begin_dev(__func__, device, PARENT_ONLY, &t);
    if (r != NVML_SUCCESS)
        return r;
    if (!pci)
        return done(NVML_ERROR_INVALID_ARGUMENT);
    unsigned dom = 0, bus = 0, dv = 0, fn = 0;
    parse_pci(t.dev->pci, &dom, &bus, &dv, &fn); /* validated at load */
    memset(pci, 0, sizeof *pci);
    snprintf(pci->busId, sizeof pci->busId, "%08X:%02X:%02X.%X", dom, bus, dv, fn);
    snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, "%04X:%02X:%02X.%X", dom & 0xFFFFu,
             bus & 0xFFu, dv & 0x1Fu, fn & 0xFu);
    pci->domain = dom;
    pci->bus = bus;
    pci->device = dv;
    pci->pciDeviceId = t.dev->pci_device_id;
    pci->pciSubSystemId = t.dev->pci_subsystem_id;
    return done(NVML_SUCCESS);
}

/* ------------------------------------------------------------ gauges */

static unsigned long long procs_memory(const fdev_t *d, const mig_t *m)
{
    unsigned long long s = 0;
    for (int i = 0; i < d->nproc; i++) {
        const proc_t *p = &d->procs[i];
        if (m && (p->gi != m->gi || (p->ci != NO_ID && p->ci != m->ci)))
            continue;
        s += p->mem;
    }
    return s;
}

static void memory_of(const target_t *t, unsigned long long *total, unsigned long long *reserved,
                      unsigned long long *used)
{
    if (t->mig) {
        *total = t->mig->total;
        *reserved = 0;
        *used = t->mig->used;
    } else {
        *total = t->dev->mem_total;
        *reserved = t->dev->mem_reserved;
        *used = t->dev->mem_used >= 0 ? (unsigned long long)t->dev->mem_used
                                      : procs_memory(t->dev, NULL);
    }
}

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory)
{
    target_t t;
    nvmlReturn_t r = begin_dev(__func__, device, MIG_OK, &t);
    if (r != NVML_SUCCESS)
        return r;
    if (!memory)
        return done(NVML_ERROR_INVALID_ARGUMENT);
    unsigned long long total, reserved, used;
    memory_of(&t, &total, &reserved, &used);
    /* v1 counts the driver's reservation as used. */
    memory->total = total;
    memory->used = used + reserved > total ? total : used + reserved;
    memory->free = total - memory->used;
    return done(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory)
{
    target_t t;
    nvmlReturn_t r = begin_dev(__func__, device, MIG_OK, &t);
    if (r != NVML_SUCCESS)
        return r;
    if (!memory)
        return done(NVML_ERROR_INVALID_ARGUMENT);
    if (memory->version != nvmlMemory_v2)
        return done(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
    unsigned long long total, reserved, used;
    memory_of(&t, &total, &reserved, &used);
    memory->total = total;
    memory->reserved = reserved;
    memory->used = used;
    memory->free = used + reserved > total ? 0 : total - used - reserved;
    return done(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t device, unsigned int *power)
{
    target_t t;
    nvmlReturn_t r = begin_dev(__func__, device, PARENT_ONLY, &t);
    if (r != NVML_SUCCESS)
        return r;
    if (!power)
        return done(NVML_ERROR_INVALID_ARGUMENT);
    *power = (unsigned)llround(t.dev->power_w * 1000.0);
    return done(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetTotalEnergyConsumption(nvmlDevice_t device, unsigned long long *energy)
{
    target_t t;
    nvmlReturn_t r = begin_dev(__func__, device, PARENT_ONLY, &t);
    if (r != NVML_SUCCESS)
        return r;
    if (!energy)
        return done(NVML_ERROR_INVALID_ARGUMENT);
    double now = now_s();
    if (g_state->energy_step_ms > 0) { /* real counters move in steps */
        double step = g_state->energy_step_ms / 1000.0;
        now = floor(now / step) * step;
    }
    double dt = now - t.dev->energy_origin;
    double mj = t.dev->energy_base_mj + (dt > 0 ? t.dev->power_w * 1000.0 * dt : 0);
    *energy = mj < 1.8e19 ? (unsigned long long)mj : ULLONG_MAX; /* no UB on odd input */
    return done(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t device, nvmlTemperatureSensors_t sensorType,
                                      unsigned int *temp)
{
    target_t t;
    nvmlReturn_t r = begin_dev(__func__, device, PARENT_ONLY, &t);
    if (r != NVML_SUCCESS)
        return r;
    if (!temp || (unsigned)sensorType >= (unsigned)NVML_TEMPERATURE_COUNT)
        return done(NVML_ERROR_INVALID_ARGUMENT);
    *temp = t.dev->temp < 0 ? 0u : (unsigned)t.dev->temp;
    return done(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetTemperatureV(nvmlDevice_t device, nvmlTemperature_t *temperature)
{
    target_t t;
    nvmlReturn_t r = begin_dev(__func__, device, PARENT_ONLY, &t);
    if (r != NVML_SUCCESS)
        return r;
    if (!temperature || (unsigned)temperature->sensorType >= (unsigned)NVML_TEMPERATURE_COUNT)
        return done(NVML_ERROR_INVALID_ARGUMENT);
    if (temperature->version != nvmlTemperature_v1)
        return done(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
    temperature->temperature = t.dev->temp;
    return done(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t device, nvmlMemoryErrorType_t errorType,
                                         nvmlEccCounterType_t counterType,
                                         unsigned long long *eccCounts)
{
    target_t t;
    nvmlReturn_t r = begin_dev(__func__, device, PARENT_ONLY, &t);
    if (r != NVML_SUCCESS)
        return r;
    if (!eccCounts || (unsigned)counterType > (unsigned)NVML_AGGREGATE_ECC)
        return done(NVML_ERROR_INVALID_ARGUMENT);
    /* Volatile and aggregate counters are the same: no driver reloads here. */
    if (errorType == NVML_MEMORY_ERROR_TYPE_CORRECTED)
        *eccCounts = t.dev->ecc_c;
    else if (errorType == NVML_MEMORY_ERROR_TYPE_UNCORRECTED)
        *eccCounts = t.dev->ecc_u;
    else
        return done(NVML_ERROR_INVALID_ARGUMENT);
    return done(NVML_SUCCESS);
}

/* ------------------------------------------------- throttling and errors */

/* Seconds a reason active the first FRACTION of every THROTTLE_PERIOD_S since its
 * origin was active in (origin, origin + dt]: FakeNvml keeps the same sum in Python. */
static double duty_active_s(double dt, double fraction)
{
    if (dt <= 0)
        return 0;
    double periods = floor(dt / THROTTLE_PERIOD_S);
    double rest = dt - periods * THROTTLE_PERIOD_S;
    double on = fraction * THROTTLE_PERIOD_S;
    return periods * on + (rest < on ? rest : on);
}

static int policy_active(const fdev_t *d, unsigned pol, double now)
{
    if (!d->viol_on[pol] || d->viol_fraction[pol] <= 0)
        return 0;
    double phase = fmod(now - d->viol_origin[pol], THROTTLE_PERIOD_S);
    if (phase < 0)
        phase += THROTTLE_PERIOD_S;
    return phase < d->viol_fraction[pol] * THROTTLE_PERIOD_S;
}

nvmlReturn_t nvmlDeviceGetViolationStatus(nvmlDevice_t device, nvmlPerfPolicyType_t perfPolicyType,
                                          nvmlViolationTime_t *violTime)
{
    target_t t;
    nvmlReturn_t r = begin_dev(__func__, device, PARENT_ONLY, &t);
    if (r != NVML_SUCCESS)
        return r;
    unsigned pol = (unsigned)perfPolicyType;
    if (!violTime || pol >= MAX_POLICY)
        return done(NVML_ERROR_INVALID_ARGUMENT);
    if (!t.dev->viol_on[pol])
        return done(NVML_ERROR_NOT_SUPPORTED);
    double now = now_s();
    double ns = t.dev->viol_base_ns[pol] +
                duty_active_s(now - t.dev->viol_origin[pol], t.dev->viol_fraction[pol]) * 1e9;
    violTime->referenceTime = now > 0 ? (unsigned long long)(now * 1e6) : 0ull;
    violTime->violationTime = ns < 1.8e19 ? (unsigned long long)ns : ULLONG_MAX;
    return done(NVML_SUCCESS);
}

/* The nvmlClocksEventReason* bit each policy's reason shows as (0: none). */
static const unsigned long long g_policy_bit[MAX_POLICY] = {
    [0] = nvmlClocksEventReasonSwPowerCap,      [1] = nvmlClocksEventReasonSwThermalSlowdown,
    [2] = nvmlClocksEventReasonSyncBoost,       [3] = 0x200ull /* BoardLimit */,
    [4] = nvmlClocksEventReasonGpuIdle,         [5] = 0x400ull /* Reliability */,
    [10] = nvmlClocksEventReasonApplicationsClocksSetting,
};

static nvmlReturn_t clocks_reasons(const char *fn, nvmlDevice_t device, unsigned long long *out)
{
    target_t t;
    nvmlReturn_t r = begin_dev(fn, device, PARENT_ONLY, &t);
    if (r != NVML_SUCCESS)
        return r;
    if (!out)
        return done(NVML_ERROR_INVALID_ARGUMENT);
    double now = now_s();
    *out = 0;
    for (unsigned pol = 0; pol < MAX_POLICY; pol++)
        if (policy_active(t.dev, pol, now))
            *out |= g_policy_bit[pol];
    return done(NVML_SUCCESS);
}

/* The reasons the GPU can report: those of the policies it lists. */
nvmlReturn_t nvmlDeviceGetSupportedClocksEventReasons(nvmlDevice_t device,
                                                      unsigned long long *supportedClocksEventReasons)
{
    target_t t;
    nvmlReturn_t r = begin_dev(__func__, device, PARENT_ONLY, &t);
    if (r != NVML_SUCCESS)
        return r;
    if (!supportedClocksEventReasons)
        return done(NVML_ERROR_INVALID_ARGUMENT);
    *supportedClocksEventReasons = 0;
    for (unsigned pol = 0; pol < MAX_POLICY; pol++)
        if (t.dev->viol_on[pol])
            *supportedClocksEventReasons |= g_policy_bit[pol];
    return done(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetCurrentClocksEventReasons(nvmlDevice_t device,
                                                    unsigned long long *clocksEventReasons)
{
    return clocks_reasons(__func__, device, clocksEventReasons);
}

nvmlReturn_t nvmlDeviceGetCurrentClocksThrottleReasons(nvmlDevice_t device,
                                                       unsigned long long *clocksThrottleReasons)
{
    return clocks_reasons(__func__, device, clocksThrottleReasons);
}

static nvmlReturn_t sm_clock(const char *fn, nvmlDevice_t device, nvmlClockType_t type,
                             unsigned int *clock, int max)
{
    target_t t;
    nvmlReturn_t r = begin_dev(fn, device, PARENT_ONLY, &t);
    if (r != NVML_SUCCESS)
        return r;
    if (!clock || (unsigned)type >= (unsigned)NVML_CLOCK_COUNT)
        return done(NVML_ERROR_INVALID_ARGUMENT);
    if (type != NVML_CLOCK_SM || !t.dev->sm_clock_set)
        return done(NVML_ERROR_NOT_SUPPORTED);
    *clock = max ? t.dev->sm_clock_max : t.dev->sm_clock;
    return done(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetClockInfo(nvmlDevice_t device, nvmlClockType_t type, unsigned int *clock)
{
    return sm_clock(__func__, device, type, clock, 0);
}

nvmlReturn_t nvmlDeviceGetMaxClockInfo(nvmlDevice_t device, nvmlClockType_t type,
                                       unsigned int *clock)
{
    return sm_clock(__func__, device, type, clock, 1);
}

nvmlReturn_t nvmlDeviceGetRemappedRows(nvmlDevice_t device, unsigned int *corrRows,
                                       unsigned int *uncRows, unsigned int *isPending,
                                       unsigned int *failureOccurred)
{
    target_t t;
    nvmlReturn_t r = begin_dev(__func__, device, PARENT_ONLY, &t);
    if (r != NVML_SUCCESS)
        return r;
    if (!corrRows || !uncRows || !isPending || !failureOccurred)
        return done(NVML_ERROR_INVALID_ARGUMENT);
    if (!t.dev->remap_set)
        return done(NVML_ERROR_NOT_SUPPORTED);
    *corrRows = t.dev->remap[0];
    *uncRows = t.dev->remap[1];
    *isPending = t.dev->remap[2];
    *failureOccurred = t.dev->remap[3];
    return done(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetPcieReplayCounter(nvmlDevice_t device, unsigned int *value)
{
    target_t t;
    nvmlReturn_t r = begin_dev(__func__, device, PARENT_ONLY, &t);
    if (r != NVML_SUCCESS)
        return r;
    if (!value)
        return done(NVML_ERROR_INVALID_ARGUMENT);
    if (!t.dev->pcie_set)
        return done(NVML_ERROR_NOT_SUPPORTED);
    *value = t.dev->pcie_replays;
    return done(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetNvLinkState(nvmlDevice_t device, unsigned int link,
                                      nvmlEnableState_t *isActive)
{
    target_t t;
    nvmlReturn_t r = begin_dev(__func__, device, PARENT_ONLY, &t);
    if (r != NVML_SUCCESS)
        return r;
    if (!isActive || link >= MAX_LINKS)
        return done(NVML_ERROR_INVALID_ARGUMENT);
    if (!t.dev->nvlink_any)
        return done(NVML_ERROR_NOT_SUPPORTED);
    *isActive = t.dev->nvlink_on[link] ? NVML_FEATURE_ENABLED : NVML_FEATURE_DISABLED;
    return done(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetNvLinkErrorCounter(nvmlDevice_t device, unsigned int link,
                                             nvmlNvLinkErrorCounter_t counter,
                                             unsigned long long *counterValue)
{
    target_t t;
    nvmlReturn_t r = begin_dev(__func__, device, PARENT_ONLY, &t);
    if (r != NVML_SUCCESS)
        return r;
    if (!counterValue || link >= MAX_LINKS || (unsigned)counter >= NVML_NVLINK_ERROR_COUNT)
        return done(NVML_ERROR_INVALID_ARGUMENT);
    if (!t.dev->nvlink_on[link] || (unsigned)counter > NVML_NVLINK_ERROR_DL_CRC_DATA)
        return done(NVML_ERROR_NOT_SUPPORTED);
    *counterValue = t.dev->nvlink_err[link][counter];
    return done(NVML_SUCCESS);
}

/* Field values: the NVLink error totals over the active links (what the per-link
 * counters sum to); every other field answers NOT_SUPPORTED in its own nvmlReturn. */
nvmlReturn_t nvmlDeviceGetFieldValues(nvmlDevice_t device, int valuesCount,
                                      nvmlFieldValue_t *values)
{
    static const struct {
        unsigned field, counter;
    } totals[] = {{NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL, NVML_NVLINK_ERROR_DL_REPLAY},
                  {NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL, NVML_NVLINK_ERROR_DL_RECOVERY},
                  {NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL, NVML_NVLINK_ERROR_DL_CRC_FLIT},
                  {NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL, NVML_NVLINK_ERROR_DL_CRC_DATA}};
    target_t t;
    nvmlReturn_t r = begin_dev(__func__, device, PARENT_ONLY, &t);
    if (r != NVML_SUCCESS)
        return r;
    if (!values || valuesCount < 0)
        return done(NVML_ERROR_INVALID_ARGUMENT);
    double now = now_s();
    for (int i = 0; i < valuesCount; i++) {
        nvmlFieldValue_t *v = &values[i];
        v->timestamp = now > 0 ? (long long)(now * 1e6) : 0;
        v->latencyUsec = 0;
        v->valueType = NVML_VALUE_TYPE_UNSIGNED_LONG_LONG;
        v->nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
        for (size_t k = 0; k < sizeof totals / sizeof totals[0]; k++) {
            if (v->fieldId != totals[k].field || !t.dev->nvlink_any)
                continue;
            unsigned long long sum = 0;
            for (int link = 0; link < MAX_LINKS; link++)
                if (t.dev->nvlink_on[link])
                    sum += t.dev->nvlink_err[link][totals[k].counter];
            v->value.ullVal = sum;
            v->nvmlReturn = NVML_SUCCESS;
        }
    }
    return done(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t *utilization)
{
    target_t t;
    nvmlReturn_t r = begin_dev(__func__, device, PARENT_ONLY, &t);
    if (r != NVML_SUCCESS)
        return r;
    if (!utilization)
        return done(NVML_ERROR_INVALID_ARGUMENT);
    if (MIG_ENABLED(t.dev)) /* documented: not supported on MIG-enabled GPUs */
        return done(NVML_ERROR_NOT_SUPPORTED);
    /* the newest device sample's period: on the clock device samples are stamped on */
    unsigned long long k = stamp_now_us(g_state->device_boot) /
                           ((unsigned long long)g_state->period_ms * 1000ull);
    double m = mean_dev(t.dev, NULL, k_time(g_state, k ? k - 1 : 0), k_time(g_state, k));
    utilization->gpu = pct_round(m);
    utilization->memory = pct_round(m * 0.5);
    return done(NVML_SUCCESS);
}

/* --------------------------------------------------------------- processes */

static nvmlReturn_t list_procs(const char *fn, nvmlDevice_t device, unsigned kind,
                               unsigned int *infoCount, nvmlProcessInfo_t *infos)
{
    target_t t;
    nvmlReturn_t r = begin_dev(fn, device, MIG_OK, &t);
    if (r != NVML_SUCCESS)
        return r;
    if (!infoCount)
        return done(NVML_ERROR_INVALID_ARGUMENT);
    const fdev_t *d = t.dev;
    unsigned n = 0;
    for (int pass = 0; pass < 2; pass++) {
        if (pass == 1) {
            if (n == 0) {
                *infoCount = 0;
                return done(NVML_SUCCESS);
            }
            if (*infoCount < n || !infos) {
                *infoCount = n;
                return done(NVML_ERROR_INSUFFICIENT_SIZE);
            }
            n = 0;
        }
        for (int i = 0; i < d->nproc; i++) {
            const proc_t *p = &d->procs[i];
            if (!(p->kinds & kind))
                continue;
            /* A MIG handle lists only its own compute instance's processes;
             * the parent lists all of them, with their instance ids. */
            if (t.mig && (p->gi != t.mig->gi || (p->ci != NO_ID && p->ci != t.mig->ci)))
                continue;
            if (pass == 1) {
                infos[n].pid = p->pid;
                infos[n].usedGpuMemory = p->mem;
                infos[n].gpuInstanceId = d->nmig ? p->gi : NO_ID;
                infos[n].computeInstanceId = d->nmig ? p->ci : NO_ID;
            }
            n++;
        }
    }
    *infoCount = n;
    return done(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device, unsigned int *infoCount,
                                                     nvmlProcessInfo_t *infos)
{
    return list_procs(__func__, device, KIND_COMPUTE, infoCount, infos);
}

nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v3(nvmlDevice_t device,
                                                      unsigned int *infoCount,
                                                      nvmlProcessInfo_t *infos)
{
    return list_procs(__func__, device, KIND_GRAPHICS, infoCount, infos);
}

nvmlReturn_t nvmlDeviceGetMPSComputeRunningProcesses_v3(nvmlDevice_t device,
                                                        unsigned int *infoCount,
                                                        nvmlProcessInfo_t *infos)
{
    return list_procs(__func__, device, KIND_MPS, infoCount, infos);
}

/* ------------------------------------------------------------ sample buffers */

/* Device sample k (lock held): 1 and its value when the buffer holds it; 0
 * when it is missing, not taken yet, older than floor_us, or (idle_samples 0)
 * idle, as real drivers keep no samples while a GPU is idle.  A sample covers
 * the time since the previous grid sample (two back when that one is
 * missing), so the first one after an idle gap covers one period only. */
static int idle_period(const fdev_t *d, unsigned long long k)
{
    return k > 0 && pct_round(mean_dev(d, NULL, (double)sample_us(g_state, k - 1) / 1e6,
                                       (double)sample_us(g_state, k) / 1e6)) == 0;
}

/* With idle_samples 0 the first sample after an idle period is never a missing
 * one (a driver resuming from idle takes it), so it covers its own period only. */
static int device_missing(const fdev_t *d, unsigned long long k)
{
    return sample_missing(g_state, k) && !(g_state->idle_dry && idle_period(d, k - 1));
}

static int device_sample(const fdev_t *d, nvmlSamplingType_t type, unsigned long long k,
                         unsigned long long now, unsigned long long floor_us, unsigned *value)
{
    unsigned long long ts = sample_us(g_state, k);
    if (device_missing(d, k) || ts > now || ts <= floor_us)
        return 0;
    if (type == NVML_TOTAL_POWER_SAMPLES) {
        *value = (unsigned)llround(d->power_w * 1000.0);
        return 1;
    }
    unsigned long long prev = k ? k - 1 : 0;
    if (prev && device_missing(d, prev))
        prev--;
    double m = mean_dev(d, NULL, (double)sample_us(g_state, prev) / 1e6, (double)ts / 1e6);
    if (g_state->idle_dry && pct_round(m) == 0)
        return 0;
    *value = pct_round(type == NVML_GPU_UTILIZATION_SAMPLES ? m : m * 0.5);
    return 1;
}

/* A device buffer is a ring of buffer_samples slots of samples taken: a
 * missing sample or (idle_samples 0) an idle one takes no slot, so on a bursty
 * GPU the ring reaches back further than buffer_samples periods.  The walk back
 * that finds the ring's oldest sample looks at no more than RING_REACH times
 * buffer_samples periods: a GPU that took fewer samples than that over so long
 * holds only those of the last RING_REACH * buffer_samples periods. */
#define RING_REACH 64ull

/* The first sample index at which d can take a sample of this type (lock
 * held).  Power samples are always taken, and so are all samples with
 * idle_samples 1: 0.  Otherwise a sample of 0 % is not taken, and until the
 * device's data begins (the earliest FROM of its util patterns and its
 * processes' sm patterns, derived and "none" entries aside) it is idle: the
 * period before that one, conservatively; ULLONG_MAX without any pattern (an
 * idle GPU takes none). */
static unsigned long long first_sample_k(const fdev_t *d, nvmlSamplingType_t type)
{
    if (type == NVML_TOTAL_POWER_SAMPLES || !g_state->idle_dry)
        return 0;
    double from = INFINITY;
    for (int i = 0; i < d->util.n; i++)
        if (!d->util.v[i].derived) {
            from = d->util.v[i].from; /* FROM does not decrease */
            break;
        }
    for (int p = 0; p < d->nproc; p++) {
        const tracelist_t *tl = &d->procs[p].sm;
        for (int i = 0; i < tl->n; i++)
            if (!tl->v[i].derived) {
                from = fmin(from, tl->v[i].from);
                break;
            }
    }
    if (!isfinite(from))
        return ULLONG_MAX;
    /* Sample k ends by (k + 1) * period (jitter below one period), so none
     * before this one can cover any of the data. */
    double k = floor(from * 1e6 / ((double)g_state->period_ms * 1000.0)) - 1.0;
    return k <= 0 ? 0ull : k < 1.8e19 ? (unsigned long long)k : ULLONG_MAX;
}

/* The samples a read of d's ring returns (lock held): those whose reported
 * stamp (shift: driver_shift_us) is after last_seen (as the caller passed it;
 * 0: all) among its buffer_samples newest taken ones, in [*k_lo, *k_hi] (not
 * every k there is taken); returns how many.  A walk back from the newest
 * period through device_sample(), so it counts exactly what the read returns.
 * Stamps grow with k (jitter below one period); sample k may be stamped after
 * a last_seen in its own period, and the reported stamps are compared, as a
 * stamp taken back to the fake clock may come out a microsecond early. */
static unsigned long long device_ring(const fdev_t *d, nvmlSamplingType_t type,
                                      unsigned long long last_seen, double shift,
                                      unsigned long long now, unsigned long long floor_us,
                                      unsigned long long *k_lo, unsigned long long *k_hi)
{
    unsigned long long per = (unsigned long long)g_state->period_ms * 1000ull;
    unsigned long long hi = now / per, n = g_state->buffer_samples;
    unsigned long long bound = first_sample_k(d, type);
    unsigned long long reach = RING_REACH * n;
    if (hi >= reach && hi - reach + 1 > bound)
        bound = hi - reach + 1;
    if (floor_us / per > bound) /* none is older than floor_us */
        bound = floor_us / per;
    unsigned long long seen_k = from_driver_us(last_seen, shift) / per;
    if (seen_k > 0 && seen_k - 1 > bound)
        bound = seen_k - 1;
    unsigned long long taken = 0, lo = hi + 1;
    unsigned v;
    for (unsigned long long k = hi + 1; k-- > bound && taken < n;) {
        if (last_seen && to_driver_us(sample_us(g_state, k), shift) <= last_seen)
            break;
        if (device_sample(d, type, k, now, floor_us, &v)) {
            taken++;
            lo = k;
        }
    }
    *k_lo = lo;
    *k_hi = hi;
    return taken;
}

nvmlReturn_t nvmlDeviceGetSamples(nvmlDevice_t device, nvmlSamplingType_t type,
                                  unsigned long long lastSeenTimeStamp,
                                  nvmlValueType_t *sampleValType, unsigned int *sampleCount,
                                  nvmlSample_t *samples)
{
    target_t t;
    nvmlReturn_t r = begin_dev(__func__, device, PARENT_ONLY, &t);
    if (r != NVML_SUCCESS)
        return r;
    if (!sampleCount || !sampleValType || (samples && *sampleCount == 0))
        return done(NVML_ERROR_INVALID_ARGUMENT);
    if (type != NVML_TOTAL_POWER_SAMPLES && type != NVML_GPU_UTILIZATION_SAMPLES &&
        type != NVML_MEMORY_UTILIZATION_SAMPLES)
        return done(NVML_ERROR_NOT_SUPPORTED);
    if (MIG_ENABLED(t.dev) && type != NVML_TOTAL_POWER_SAMPLES) /* documented for MIG */
        return done(NVML_ERROR_NOT_SUPPORTED);
    int boot = g_state->device_boot;
    unsigned long long lo, hi, now = stamp_now_us(boot);
    double shift = driver_shift_us(boot);
    /* On the boot clock nothing is older than the boot. */
    unsigned long long floor_us = boot && shift < 0 ? (unsigned long long)-shift : 0;
    unsigned long long avail =
        device_ring(t.dev, type, lastSeenTimeStamp, shift, now, floor_us, &lo, &hi);
    unsigned v;
    if (!avail)
        return done(NVML_ERROR_NOT_FOUND);
    *sampleValType = NVML_VALUE_TYPE_UNSIGNED_INT;
    if (!samples) {
        *sampleCount = (unsigned)avail;
        return done(NVML_SUCCESS);
    }
    /* Oldest first; a short buffer gets the oldest ones, so a caller that
     * continues from the newest timestamp it got loses nothing. */
    unsigned n = 0;
    for (unsigned long long k = lo; k <= hi && n < *sampleCount; k++) {
        if (!device_sample(t.dev, type, k, now, floor_us, &v))
            continue;
        samples[n].timeStamp = to_driver_us(sample_us(g_state, k), shift);
        samples[n++].sampleValue.uiVal = v;
    }
    *sampleCount = n;
    return done(NVML_SUCCESS);
}

typedef struct {
    unsigned pid;
    unsigned long long ts;
    unsigned sm;
} psample_t;

/* Periods by which process p's samples come late: (PID % 10) / 9 of
 * process_stagger, as drivers hand out samples of different ages per process. */
static unsigned long long stagger_periods(const proc_t *p)
{
    double lag_s = g_state->stagger_s * (double)(p->pid % 10u) / 9.0;
    return (unsigned long long)llround(lag_s * 1000.0 / (double)g_state->period_ms);
}

/* Collect process samples after last_seen (lock held).  Grid mode: one per
 * process and sample period, oldest period first; latest mode: only each
 * process's newest one.  Samples of 0 % are left out unless
 * process_zero_samples is set (the driver reports processes "that had some
 * non-zero utilization"); none is older than floor_us (the boot, on the boot
 * clock) or newer than now (stamp_now_us() of the call's clock).  Returns the
 * count, or -1 when out of memory. */
static long collect_psamples(const fdev_t *d, unsigned long long last_seen, psample_t **out,
                             unsigned long long *first_k, unsigned long long floor_us,
                             unsigned long long now)
{
    *out = NULL;
    unsigned long long lo, hi;
    if (!sample_range(g_state, last_seen, now, &lo, &hi))
        return 0;
    *first_k = lo;
    unsigned long long per_us = (unsigned long long)g_state->period_ms * 1000ull;
    size_t cap = 0, n = 0;
    psample_t *v = NULL;
    for (unsigned long long k = lo; k <= hi; k++) {
        for (int i = 0; i < d->nproc; i++) {
            const proc_t *p = &d->procs[i];
            if (!has_samples(&p->sm) || k + stagger_periods(p) > hi || k * per_us <= floor_us)
                continue;
            double mean = mean_dev(NULL, &p->sm, k_time(g_state, k - 1), k_time(g_state, k));
            if (pct_round(mean) == 0 && !g_state->zero_samples)
                continue;
            /* psm_scale: a driver that reports more than 100 % */
            unsigned sm = p->sm_scale == 1.0 ? pct_round(mean)
                                             : (unsigned)llround(mean * p->sm_scale);
            if (g_state->proc_latest) {
                /* keep only the newest sample per pid: overwrite an older one */
                size_t j;
                for (j = 0; j < n && v[j].pid != p->pid; j++)
                    ;
                if (j < n) {
                    v[j].ts = k * per_us;
                    v[j].sm = sm;
                    continue;
                }
            }
            if (n == cap) {
                size_t ncap = cap ? cap * 2 : 64;
                psample_t *nv = realloc(v, ncap * sizeof *nv);
                if (!nv) {
                    free(v);
                    return -1;
                }
                v = nv;
                cap = ncap;
            }
            v[n].pid = p->pid;
            v[n].ts = k * per_us;
            v[n].sm = sm;
            n++;
        }
    }
    /* pgarbage: as reported (nvtop #110), a sample of smUtil 37100 stamped far ahead of
     * the others (7 years), in about one read in N: by a hash of the read's newest period, so both
     * calls of one read (sizing and filling) see the same, and polls a whole number of
     * periods apart do not always or never hit. */
    for (int i = 0; i < d->nproc && n; i++) {
        const proc_t *p = &d->procs[i];
        if (!p->garbage || mix(hi ^ p->pid) % p->garbage)
            continue;
        psample_t *nv = n < cap ? v : realloc(v, (cap = cap * 2 + 1) * sizeof *nv);
        if (!nv) {
            free(v);
            return -1;
        }
        v = nv;
        v[n].pid = p->pid;
        v[n].ts = hi * per_us + 217144956601725ull; /* nvtop's value, as an offset */
        v[n].sm = 37100;
        n++;
    }
    *out = v;
    return (long)n;
}

static int cmp_psample(const void *a, const void *b)
{
    const psample_t *x = a, *y = b;
    if (x->ts != y->ts)
        return x->ts < y->ts ? -1 : 1;
    return x->pid < y->pid ? -1 : x->pid > y->pid;
}

nvmlReturn_t nvmlDeviceGetProcessUtilization(nvmlDevice_t device,
                                             nvmlProcessUtilizationSample_t *utilization,
                                             unsigned int *processSamplesCount,
                                             unsigned long long lastSeenTimeStamp)
{
    target_t t;
    nvmlReturn_t r = begin_dev(__func__, device, PARENT_ONLY, &t);
    if (r != NVML_SUCCESS)
        return r;
    if (!processSamplesCount)
        return done(NVML_ERROR_INVALID_ARGUMENT);
    if (MIG_ENABLED(t.dev)) /* documented: not supported on MIG-enabled GPUs */
        return done(NVML_ERROR_NOT_SUPPORTED);
    psample_t *v;
    unsigned long long first_k = 0;
    int boot = g_state->process_boot;
    double shift = driver_shift_us(boot);
    unsigned long long floor_us = boot && shift < 0 ? (unsigned long long)-shift : 0;
    long n = collect_psamples(t.dev, from_driver_us(lastSeenTimeStamp, shift), &v, &first_k,
                              floor_us, stamp_now_us(boot));
    if (n < 0)
        return done(NVML_ERROR_MEMORY);
    if (n == 0) {
        free(v);
        return done(NVML_ERROR_NOT_FOUND);
    }
    /* Oldest first (latest mode collects them in pid order). */
    qsort(v, (size_t)n, sizeof *v, cmp_psample);
    if (!utilization || *processSamplesCount < (unsigned long)n) {
        if (!utilization || *processSamplesCount == 0) {
            *processSamplesCount = (unsigned)n;
            free(v);
            return done(NVML_ERROR_INSUFFICIENT_SIZE);
        }
        /* Buffer sized by an earlier call and a period has ended since: drop
         * whole newest periods, so no period is ever split. */
        long keep = (long)*processSamplesCount;
        while (keep > 0 && keep < n && v[keep].ts == v[keep - 1].ts)
            keep--;
        if (keep == 0) {
            *processSamplesCount = (unsigned)n;
            free(v);
            return done(NVML_ERROR_INSUFFICIENT_SIZE);
        }
        n = keep;
    }
    for (long i = 0; i < n; i++) {
        utilization[i].pid = v[i].pid;
        utilization[i].timeStamp = to_driver_us(v[i].ts, shift);
        utilization[i].smUtil = v[i].sm;
        utilization[i].memUtil = pct_round(v[i].sm * 0.5);
        utilization[i].encUtil = 0;
        utilization[i].decUtil = 0;
    }
    *processSamplesCount = (unsigned)n;
    free(v);
    return done(NVML_SUCCESS);
}

/* --------------------------------------------------------------------- MIG */

nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t device, unsigned int *currentMode,
                                  unsigned int *pendingMode)
{
    target_t t;
    nvmlReturn_t r = begin_dev(__func__, device, PARENT_ONLY, &t);
    if (r != NVML_SUCCESS)
        return r;
    if (!currentMode || !pendingMode)
        return done(NVML_ERROR_INVALID_ARGUMENT);
    *currentMode = *pendingMode = MIG_ENABLED(t.dev) ? NVML_DEVICE_MIG_ENABLE
                                                     : NVML_DEVICE_MIG_DISABLE;
    return done(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t device, unsigned int *count)
{
    target_t t;
    nvmlReturn_t r = begin_dev(__func__, device, PARENT_ONLY, &t);
    if (r != NVML_SUCCESS)
        return r;
    if (!count)
        return done(NVML_ERROR_INVALID_ARGUMENT);
    /* The maximum, not the current number: 7 on A100/H100, 0 without MIG. */
    *count = MIG_ENABLED(t.dev) ? (unsigned)(t.dev->nmig > 7 ? t.dev->nmig : 7) : 0;
    return done(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t device, unsigned int index,
                                                 nvmlDevice_t *migDevice)
{
    target_t t;
    nvmlReturn_t r = begin_dev(__func__, device, PARENT_ONLY, &t);
    if (r != NVML_SUCCESS)
        return r;
    if (!migDevice)
        return done(NVML_ERROR_INVALID_ARGUMENT);
    if (!MIG_ENABLED(t.dev))
        return done(NVML_ERROR_NOT_SUPPORTED);
    unsigned max = (unsigned)(t.dev->nmig > 7 ? t.dev->nmig : 7);
    if (index >= max)
        return done(NVML_ERROR_INVALID_ARGUMENT);
    if (index >= (unsigned)t.dev->nmig)
        return done(NVML_ERROR_NOT_FOUND);
    *migDevice = &g_mig[t.slot][index];
    return done(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceIsMigDeviceHandle(nvmlDevice_t device, unsigned int *isMigDevice)
{
    target_t t;
    nvmlReturn_t r = begin_dev(__func__, device, MIG_OK, &t);
    if (r != NVML_SUCCESS)
        return r;
    if (!isMigDevice)
        return done(NVML_ERROR_INVALID_ARGUMENT);
    *isMigDevice = t.mig ? 1u : 0u;
    return done(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetDeviceHandleFromMigDeviceHandle(nvmlDevice_t migDevice,
                                                          nvmlDevice_t *device)
{
    target_t t;
    nvmlReturn_t r = begin_dev(__func__, migDevice, MIG_OK, &t);
    if (r != NVML_SUCCESS)
        return r;
    if (!device || !t.mig)
        return done(NVML_ERROR_INVALID_ARGUMENT);
    *device = &g_parent[t.slot];
    return done(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetGpuInstanceId(nvmlDevice_t device, unsigned int *id)
{
    target_t t;
    nvmlReturn_t r = begin_dev(__func__, device, MIG_OK, &t);
    if (r != NVML_SUCCESS)
        return r;
    if (!id || !t.mig)
        return done(NVML_ERROR_INVALID_ARGUMENT);
    *id = t.mig->gi;
    return done(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetComputeInstanceId(nvmlDevice_t device, unsigned int *id)
{
    target_t t;
    nvmlReturn_t r = begin_dev(__func__, device, MIG_OK, &t);
    if (r != NVML_SUCCESS)
        return r;
    if (!id || !t.mig)
        return done(NVML_ERROR_INVALID_ARGUMENT);
    *id = t.mig->ci;
    return done(NVML_SUCCESS);
}

/* --------------------------------------------------------------------- GPM */

/* nvidia-ml-py declares these structs in ctypes; its layout must be the
 * header's (pynvml: c_nvmlGpmMetric_t, c_nvmlGpmMetricsGet_t, c_nvmlGpmSupport_t). */
_Static_assert(sizeof(nvmlGpmMetric_t) == 40, "nvmlGpmMetric_t is not pynvml's layout");
_Static_assert(offsetof(nvmlGpmMetric_t, value) == 8, "nvmlGpmMetric_t.value offset");
_Static_assert(offsetof(nvmlGpmMetricsGet_t, sample1) == 8, "nvmlGpmMetricsGet_t.sample1");
_Static_assert(offsetof(nvmlGpmMetricsGet_t, metrics) == 24, "nvmlGpmMetricsGet_t.metrics");
_Static_assert(sizeof(nvmlGpmSupport_t) == 8, "nvmlGpmSupport_t is not pynvml's layout");

/* A sample records what was sampled (GPU slot, MIG GPU instance or NO_ID) and
 * when (the fake clock); nvmlGpmMetricsGet computes the exact mean of each
 * metric's trace between two samples of the same target. */
struct nvmlGpmSample_st {
    int filled;
    int slot;
    unsigned gi;
    double t;
};

static struct nvmlGpmSample_st **g_samples; /* live samples, to reject stray pointers */
static int g_nsamples, g_capsamples;

static int find_sample(nvmlGpmSample_t s)
{
    for (int i = 0; s && i < g_nsamples; i++)
        if (g_samples[i] == s)
            return i;
    return -1;
}

nvmlReturn_t nvmlGpmSampleAlloc(nvmlGpmSample_t *gpmSample)
{
    nvmlReturn_t r = begin(__func__);
    if (r != NVML_SUCCESS)
        return r;
    if (!gpmSample)
        return done(NVML_ERROR_INVALID_ARGUMENT);
    struct nvmlGpmSample_st *s = calloc(1, sizeof *s);
    if (!s || grow((void **)&g_samples, &g_capsamples, g_nsamples, sizeof *g_samples)) {
        free(s);
        return done(NVML_ERROR_MEMORY);
    }
    g_samples[g_nsamples++] = s;
    *gpmSample = s;
    return done(NVML_SUCCESS);
}

nvmlReturn_t nvmlGpmSampleFree(nvmlGpmSample_t gpmSample)
{
    nvmlReturn_t r = begin(__func__);
    if (r != NVML_SUCCESS)
        return r;
    int i = find_sample(gpmSample);
    if (i < 0)
        return done(NVML_ERROR_INVALID_ARGUMENT);
    free(g_samples[i]);
    g_samples[i] = g_samples[--g_nsamples];
    return done(NVML_SUCCESS);
}

nvmlReturn_t nvmlGpmQueryDeviceSupport(nvmlDevice_t device, nvmlGpmSupport_t *gpmSupport)
{
    target_t t;
    nvmlReturn_t r = begin_dev(__func__, device, MIG_OK, &t);
    if (r != NVML_SUCCESS)
        return r;
    if (!gpmSupport)
        return done(NVML_ERROR_INVALID_ARGUMENT);
    if (gpmSupport->version != NVML_GPM_SUPPORT_VERSION)
        return done(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
    gpmSupport->isSupportedDevice = t.dev->gpm_support ? 1u : 0u;
    return done(NVML_SUCCESS);
}

static int has_mig_gi(const fdev_t *d, unsigned gi)
{
    for (int i = 0; i < d->nmig; i++)
        if (d->mig[i].gi == gi)
            return 1;
    return 0;
}

/* Record a sample of (slot, gi) now (lock held; t resolved). */
static nvmlReturn_t take_gpm_sample(const target_t *t, unsigned gi, nvmlGpmSample_t gpmSample)
{
    if (find_sample(gpmSample) < 0)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (!t->dev->gpm_support)
        return NVML_ERROR_NOT_SUPPORTED;
    gpmSample->filled = 1;
    gpmSample->slot = t->slot;
    gpmSample->gi = gi;
    gpmSample->t = now_s();
    return NVML_SUCCESS;
}

/* A device handle samples the whole GPU; a MIG device handle its GPU instance. */
nvmlReturn_t nvmlGpmSampleGet(nvmlDevice_t device, nvmlGpmSample_t gpmSample)
{
    target_t t;
    nvmlReturn_t r = begin_dev(__func__, device, MIG_OK, &t);
    if (r != NVML_SUCCESS)
        return r;
    return done(take_gpm_sample(&t, t.mig ? t.mig->gi : NO_ID, gpmSample));
}

nvmlReturn_t nvmlGpmMigSampleGet(nvmlDevice_t device, unsigned int gpuInstanceId,
                                 nvmlGpmSample_t gpmSample)
{
    target_t t;
    nvmlReturn_t r = begin_dev(__func__, device, PARENT_ONLY, &t);
    if (r != NVML_SUCCESS)
        return r;
    if (!t.dev->nmig)
        return done(NVML_ERROR_NOT_SUPPORTED);
    if (!has_mig_gi(t.dev, gpuInstanceId))
        return done(NVML_ERROR_NOT_FOUND);
    return done(take_gpm_sample(&t, gpuInstanceId, gpmSample));
}

static const tracelist_t *gpm_trace(const fdev_t *d, unsigned gi, unsigned metric)
{
    for (int i = 0; i < d->ngpm; i++)
        if (d->gpm[i].gi == gi && d->gpm[i].metric == metric)
            return &d->gpm[i].tl;
    return NULL;
}

nvmlReturn_t nvmlGpmMetricsGet(nvmlGpmMetricsGet_t *metricsGet)
{
    nvmlReturn_t r = begin(__func__);
    if (r != NVML_SUCCESS)
        return r;
    if (!metricsGet)
        return done(NVML_ERROR_INVALID_ARGUMENT);
    if (metricsGet->version != NVML_GPM_METRICS_GET_VERSION)
        return done(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
    const struct nvmlGpmSample_st *a = metricsGet->sample1, *b = metricsGet->sample2;
    if (metricsGet->numMetrics > NVML_GPM_METRIC_MAX || find_sample(metricsGet->sample1) < 0 ||
        find_sample(metricsGet->sample2) < 0 || !a->filled || !b->filled || a->slot != b->slot ||
        a->gi != b->gi || !(b->t > a->t))
        return done(NVML_ERROR_INVALID_ARGUMENT);
    fdev_t *d = &g_state->dev[a->slot];
    if (!d->present || d->lost)
        return done(NVML_ERROR_GPU_IS_LOST);
    if ((r = error_for(d, __func__)) != NVML_SUCCESS)
        return done(r);
    if (a->gi != NO_ID && !has_mig_gi(d, a->gi))
        return done(NVML_ERROR_NOT_FOUND); /* the GPU instance went away */
    for (unsigned i = 0; i < metricsGet->numMetrics; i++) {
        nvmlGpmMetric_t *m = &metricsGet->metrics[i];
        const gpm_info_t *info = gpm_metric_info(m->metricId);
        memset(&m->metricInfo, 0, sizeof m->metricInfo);
        m->value = 0;
        if (!info || (info->device_only && a->gi != NO_ID)) {
            m->nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
            continue;
        }
        const tracelist_t *tl = gpm_trace(d, a->gi, m->metricId);
        m->nvmlReturn = NVML_SUCCESS;
        m->value = tl ? mean_dev(NULL, tl, a->t, b->t) : 0.0;
        m->metricInfo.shortName = (char *)info->shortName;
        m->metricInfo.longName = (char *)info->longName;
        m->metricInfo.unit = (char *)info->unit;
    }
    return done(NVML_SUCCESS);
}

/* ------------------------------------------------------------------ events */

static struct nvmlEventSet_st *check_set(nvmlEventSet_t set)
{
    uintptr_t a = (uintptr_t)set, s0 = (uintptr_t)&g_sets[0], s1 = (uintptr_t)&g_sets[MAX_SETS];
    if (a < s0 || a >= s1 || (a - s0) % sizeof(struct nvmlEventSet_st) != 0)
        return NULL;
    return set->used ? set : NULL;
}

nvmlReturn_t nvmlDeviceGetSupportedEventTypes(nvmlDevice_t device, unsigned long long *eventTypes)
{
    target_t t;
    nvmlReturn_t r = begin_dev(__func__, device, PARENT_ONLY, &t);
    if (r != NVML_SUCCESS)
        return r;
    if (!eventTypes)
        return done(NVML_ERROR_INVALID_ARGUMENT);
    *eventTypes = SUPPORTED_EVENTS;
    return done(NVML_SUCCESS);
}

nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t *set)
{
    nvmlReturn_t r = begin(__func__);
    if (r != NVML_SUCCESS)
        return r;
    if (!set)
        return done(NVML_ERROR_INVALID_ARGUMENT);
    for (int i = 0; i < MAX_SETS; i++) {
        if (!g_sets[i].used) {
            memset(&g_sets[i], 0, sizeof g_sets[i]);
            g_sets[i].used = 1;
            *set = &g_sets[i];
            return done(NVML_SUCCESS);
        }
    }
    return done(NVML_ERROR_INSUFFICIENT_RESOURCES);
}

nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t device, unsigned long long eventTypes,
                                      nvmlEventSet_t set)
{
    target_t t;
    nvmlReturn_t r = begin_dev(__func__, device, PARENT_ONLY, &t);
    if (r != NVML_SUCCESS)
        return r;
    struct nvmlEventSet_st *s = check_set(set);
    if (!s || !eventTypes)
        return done(NVML_ERROR_INVALID_ARGUMENT);
    if (eventTypes & ~(unsigned long long)SUPPORTED_EVENTS)
        return done(NVML_ERROR_NOT_SUPPORTED);
    /* Events that happened before registration are not recorded. */
    if (!s->mask[t.slot])
        s->reg_time[t.slot] = now_s();
    s->mask[t.slot] |= eventTypes;
    return done(NVML_SUCCESS);
}

/* Next undelivered Xid for the set (lock held): fills data, returns 1. */
static int take_xid(struct nvmlEventSet_st *s, nvmlEventData_t *data, nvmlReturn_t *err)
{
    for (int i = 0; i < MAX_DEV; i++) {
        if (!s->mask[i])
            continue;
        fdev_t *d = &g_state->dev[i];
        if (!d->present || d->lost) {
            *err = NVML_ERROR_GPU_IS_LOST;
            return 0;
        }
        nvmlReturn_t e = error_for(d, "nvmlEventSetWait_v2");
        if (e != NVML_SUCCESS) {
            *err = e;
            return 0;
        }
        if (!(s->mask[i] & nvmlEventTypeXidCriticalError))
            continue;
        for (int j = 0; j < d->nxid; j++) {
            const xid_t *x = &d->xids[j];
            if (s->has_last[i] && x->seq <= s->last_seq[i])
                continue;
            if (x->time != 0 && x->time < s->reg_time[i])
                continue;
            s->has_last[i] = 1;
            s->last_seq[i] = x->seq;
            data->device = &g_parent[i];
            data->eventType = nvmlEventTypeXidCriticalError;
            data->eventData = x->xid;
            data->gpuInstanceId = d->nmig ? x->gi : NO_ID;
            data->computeInstanceId = d->nmig ? x->ci : NO_ID;
            return 1;
        }
    }
    return 0;
}

/* Sleep up to max_s, less when the state file's directory gets a file moved or
 * written into it (the tests replace the state file by a rename). Without inotify
 * (or FAKE_NVML_STATE unset) it polls every 100 ms. */
static void wait_state_change(double max_s)
{
    const char *path = getenv("FAKE_NVML_STATE");
    int fd = -1;
    if (path && *path) {
        char dir[PATH_MAX];
        const char *slash = strrchr(path, '/');
        size_t n = slash ? (size_t)(slash - path) : 0;
        if (n == 0 && slash)
            n = 1; /* the root directory */
        if (n < sizeof dir) {
            if (n)
                memcpy(dir, path, n);
            else
                dir[n++] = '.';
            dir[n] = '\0';
            fd = inotify_init1(IN_CLOEXEC | IN_NONBLOCK);
            if (fd >= 0 && inotify_add_watch(fd, dir, IN_MOVED_TO | IN_CLOSE_WRITE) < 0) {
                close(fd);
                fd = -1;
            }
        }
    }
    if (fd < 0) {
        sleep_s(fmin(max_s, 0.1));
        return;
    }
    struct pollfd p = {.fd = fd, .events = POLLIN};
    int ms = (int)ceil(max_s * 1000.0);
    while (poll(&p, 1, ms) < 0 && errno == EINTR)
        ;
    close(fd);
}

nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeoutms)
{
    nvmlReturn_t r = begin(__func__);
    if (r != NVML_SUCCESS)
        return r;
    if (!check_set(set) || !data)
        return done(NVML_ERROR_INVALID_ARGUMENT);
    /* Injected sleeps of the registered devices delay the answer too. */
    double extra = 0;
    for (int i = 0; i < MAX_DEV; i++)
        if (set->mask[i] && g_state->dev[i].present)
            extra = fmax(extra, sleep_for(&g_state->dev[i], __func__) - sleep_for(NULL, __func__));
    pthread_mutex_unlock(&g_lock);
    sleep_s(extra);

    double deadline = elapsed_s() + timeoutms / 1000.0; /* timeouts are real time */
    for (;;) {
        pthread_mutex_lock(&g_lock);
        if (!g_refcount) {
            r = NVML_ERROR_UNINITIALIZED;
        } else if ((r = refresh_state(NVML_ERROR_UNKNOWN)) == NVML_SUCCESS) {
            if (!check_set(set)) {
                r = NVML_ERROR_INVALID_ARGUMENT; /* freed while we waited */
            } else {
                nvmlReturn_t e = NVML_SUCCESS;
                if (take_xid(set, data, &e))
                    r = NVML_SUCCESS;
                else if (e != NVML_SUCCESS)
                    r = e;
                else
                    r = NVML_ERROR_TIMEOUT;
            }
        }
        pthread_mutex_unlock(&g_lock);
        if (r != NVML_ERROR_TIMEOUT)
            return r;
        double left = deadline - elapsed_s();
        if (left <= 0)
            return NVML_ERROR_TIMEOUT;
        /* A driver blocks here for the whole timeout, costing no CPU until an event
           or the timeout: wake only when the state file is replaced (where inotify
           works; else poll). A shutdown or a freed set is seen at the next wake, as a
           driver gives no promise for a wait under nvmlShutdown either. */
        wait_state_change(left);
    }
}

nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set)
{
    nvmlReturn_t r = begin(__func__);
    if (r != NVML_SUCCESS)
        return r;
    struct nvmlEventSet_st *s = check_set(set);
    if (!s)
        return done(NVML_ERROR_INVALID_ARGUMENT);
    s->used = 0;
    return done(NVML_SUCCESS);
}
