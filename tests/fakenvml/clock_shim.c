/*
 * An LD_PRELOAD shim for tests: clock_gettime() of a process, shifted.
 *
 * Makes the host conditions a test cannot make for real without privileges: a
 * node booted a minute ago or a year ago (its boot clock reads that), a reboot
 * (the boot clock restarts), and a step of the wall clock while a program runs
 * (NTP in a new VM's first minutes).  Everything in the process that reads a
 * clock through libc's clock_gettime() sees the shift: Python's time module,
 * the fake NVML, the program under test.
 *
 * Offsets in seconds (fractions allowed), from the environment at the first
 * read: CLOCK_SHIM_REALTIME (CLOCK_REALTIME and _COARSE) and CLOCK_SHIM_BOOTTIME
 * (CLOCK_BOOTTIME and _ALARM).  clock_shim_step(clock, seconds), called through
 * ctypes, adds to a clock's offset while the process runs.
 *
 * Unlike a time namespace, the kernel knows nothing of the shift: a wait until
 * an absolute time (pthread_cond_timedwait, sem_timedwait: Python's locks and
 * Event.wait take CLOCK_MONOTONIC deadlines) would wait the shift longer.  So
 * CLOCK_MONOTONIC is never shifted, and a realtime offset suits only a program
 * without absolute waits on CLOCK_REALTIME.  Nothing waits on CLOCK_BOOTTIME.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

enum { REAL, BOOT, NGROUPS };

static long long g_offset_ns[NGROUPS]; /* read and written atomically */
static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static int (*g_next)(clockid_t, struct timespec *);

static long long env_ns(const char *name)
{
    const char *v = getenv(name);
    return v && *v ? (long long)(strtod(v, NULL) * 1e9) : 0;
}

static void init(void)
{
    g_next = (int (*)(clockid_t, struct timespec *))dlsym(RTLD_NEXT, "clock_gettime");
    __atomic_add_fetch(&g_offset_ns[REAL], env_ns("CLOCK_SHIM_REALTIME"), __ATOMIC_SEQ_CST);
    __atomic_add_fetch(&g_offset_ns[BOOT], env_ns("CLOCK_SHIM_BOOTTIME"), __ATOMIC_SEQ_CST);
}

static int group_of(clockid_t c)
{
    switch (c) {
    case CLOCK_REALTIME:
    case CLOCK_REALTIME_COARSE:
        return REAL;
    case CLOCK_BOOTTIME:
    case CLOCK_BOOTTIME_ALARM:
        return BOOT;
    default:
        return -1;
    }
}

/* Add seconds to a clock's offset (the clock as clock_gettime names it). */
void clock_shim_step(int clock, double seconds)
{
    pthread_once(&g_once, init);
    int g = group_of((clockid_t)clock);
    if (g >= 0)
        __atomic_add_fetch(&g_offset_ns[g], (long long)(seconds * 1e9), __ATOMIC_SEQ_CST);
}

int clock_gettime(clockid_t c, struct timespec *t)
{
    pthread_once(&g_once, init);
    int rc = g_next ? g_next(c, t) : (int)syscall(SYS_clock_gettime, c, t);
    int g = group_of(c);
    if (rc != 0 || g < 0)
        return rc;
    long long off = __atomic_load_n(&g_offset_ns[g], __ATOMIC_SEQ_CST);
    long long ns = (long long)t->tv_sec * 1000000000LL + t->tv_nsec + off;
    if (ns < 0)
        ns = 0; /* a clock never reads below 0 */
    t->tv_sec = (time_t)(ns / 1000000000LL);
    t->tv_nsec = (long)(ns % 1000000000LL);
    return rc;
}
