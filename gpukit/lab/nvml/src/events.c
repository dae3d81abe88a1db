/*
 * gpukit mock NVML: events.
 *
 * Injected events are appended to $STATE_DIR/events, one line each, after a header line
 * ("# gpukit-nvml-events TOKEN") that is new whenever the log is started anew:
 *   E GPU EVENT_TYPE EVENT_DATA GI CI TIMESTAMP_NS     an event (XID: EVENT_DATA is the XID)
 *   L GPU TIMESTAMP_NS                                 the GPU fell off the bus
 * An event set remembers how far it has read; nvmlEventSetWait_v2 reads what was appended since,
 * and otherwise sleeps on inotify (IN_MODIFY on the state directory), so an injected event reaches
 * a waiting process at once. Without inotify it polls every 10 ms.
 *
 * A GPU can be given an event fault (gpukitMockSetEventFault, kept in the state file): a set that
 * watches it then gets, when no real event is pending, NVML_ERROR_TIMEOUT or a PState event at
 * once instead of blocking (a misbehaving driver, for the health loop's pacing test).
 */
#include "mock.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define EVENTSET_MAGIC 0x45565354u
/* What nvmlDeviceGetSupportedEventTypes answers: every event type nvml.h defines, i.e.
 * nvmlEventTypeAll (0xFF9F), as a real H100 does on driver 580.159.04 (65439 in
 * tests/lab/nvml/data/h100-80gb-hbm3.driver-580.159.04.json). Spelled out rather than
 * nvmlEventTypeAll so that a newer nvml.h does not silently change the answer. */
#define SUPPORTED_EVENTS                                                                           \
    (nvmlEventTypeSingleBitEccError | nvmlEventTypeDoubleBitEccError | nvmlEventTypePState |       \
     nvmlEventTypeXidCriticalError | nvmlEventTypeClock | nvmlEventTypePowerSourceChange |         \
     nvmlEventMigConfigChange | nvmlEventTypeSingleBitEccErrorStorm |                              \
     nvmlEventTypeDramRetirementEvent | nvmlEventTypeDramRetirementFailure |                       \
     nvmlEventTypeNonFatalPoisonError | nvmlEventTypeFatalPoisonError |                            \
     nvmlEventTypeGpuUnavailableError | nvmlEventTypeGpuRecoveryAction)
/* What nvmlDeviceRegisterEvents accepts: that same driver took every bit below 0x10000 (the two
 * nvml.h leaves undefined, 0x20 and 0x40, too) and refused each higher bit with
 * NVML_ERROR_NOT_SUPPORTED. */
#define REGISTERABLE_EVENTS 0xFFFFULL
_Static_assert((SUPPORTED_EVENTS & ~REGISTERABLE_EVENTS) == 0, "supported events must register");

struct nvmlEventSet_st {
    unsigned magic;
    unsigned long long mask[MOCK_MAX_GPUS];
    char head[96]; /* header line of the log the offset belongs to */
    off_t offset;
    int ifd;
    char path[PATH_MAX + 16];
};

unsigned long long mock_supported_events(void) { return SUPPORTED_EVENTS; }

/* The log's header line ("" while there is none), and its size. */
static off_t log_head(int fd, char *head, size_t n)
{
    head[0] = 0;
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0)
        return 0;
    ssize_t r = pread(fd, head, n - 1, 0);
    head[r > 0 ? r : 0] = 0;
    char *nl = strchr(head, '\n');
    if (nl)
        nl[1] = 0;
    else
        head[0] = 0; /* header not complete yet */
    return st.st_size;
}

static nvmlReturn_t create_impl(nvmlEventSet_t *set)
{
    if (!set)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct nvmlEventSet_st *s = calloc(1, sizeof *s);
    if (!s)
        return NVML_ERROR_MEMORY;
    s->magic = EVENTSET_MAGIC;
    snprintf(s->path, sizeof s->path, "%s/events", g_state_dir);
    int fd = open(s->path, O_RDONLY | O_CLOEXEC);
    s->offset = log_head(fd, s->head, sizeof s->head); /* only events from now on */
    if (fd >= 0)
        close(fd);
    s->ifd = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
    if (s->ifd >= 0) {
        mkdir(g_state_dir, 0755); /* best effort: watch needs the directory */
        if (inotify_add_watch(s->ifd, g_state_dir, IN_MODIFY | IN_CREATE | IN_MOVED_TO) < 0) {
            close(s->ifd);
            s->ifd = -1;
        }
    }
    *set = s;
    return NVML_SUCCESS;
}
EXPORT nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t *set) { LOCKED(create_impl(set)); }

static int set_ok(nvmlEventSet_t set) { return set && set->magic == EVENTSET_MAGIC; }

static nvmlReturn_t register_impl(nvmlDevice_t d, unsigned long long types, nvmlEventSet_t set)
{
    if (!set_ok(set))
        return NVML_ERROR_INVALID_ARGUMENT;
    devref r;
    nvmlReturn_t rc = dev_get(d, &r, 0);
    if (rc != NVML_SUCCESS)
        return rc;
    if (types & ~REGISTERABLE_EVENTS)
        return NVML_ERROR_NOT_SUPPORTED;
    set->mask[r.gpu] |= types;
    return NVML_SUCCESS;
}
EXPORT nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t device, unsigned long long eventTypes,
                                             nvmlEventSet_t set)
{
    LOCKED(register_impl(device, eventTypes, set));
}

static nvmlReturn_t supported_impl(nvmlDevice_t d, unsigned long long *types)
{
    if (!types)
        return NVML_ERROR_INVALID_ARGUMENT;
    devref r;
    nvmlReturn_t rc = dev_get(d, &r, 0);
    if (rc == NVML_SUCCESS)
        *types = SUPPORTED_EVENTS;
    return rc;
}
EXPORT nvmlReturn_t nvmlDeviceGetSupportedEventTypes(nvmlDevice_t device, unsigned long long *eventTypes)
{
    LOCKED(supported_impl(device, eventTypes));
}

static nvmlReturn_t free_impl(nvmlEventSet_t set)
{
    if (!set_ok(set))
        return NVML_ERROR_INVALID_ARGUMENT;
    if (set->ifd >= 0)
        close(set->ifd);
    set->magic = 0;
    free(set);
    return NVML_SUCCESS;
}
EXPORT nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set) { LOCKED(free_impl(set)); }

/* Read what was appended since the set's offset; 1 when an event for the set was found. */
static int scan(nvmlEventSet_t set, nvmlEventData_t *data, nvmlReturn_t *rc)
{
    int fd = open(set->path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    char head[sizeof set->head];
    off_t size = log_head(fd, head, sizeof head);
    if (strcmp(head, set->head) || size < set->offset) { /* a new log (after a boot) */
        memcpy(set->head, head, sizeof head);
        set->offset = 0;
    }
    char buf[8192];
    int found = 0;
    while (!found) {
        ssize_t n = pread(fd, buf, sizeof buf - 1, set->offset);
        if (n <= 0)
            break;
        buf[n] = 0;
        char *line = buf, *nl;
        int progressed = 0;
        while (!found && (nl = memchr(line, '\n', (size_t)(buf + n - line)))) {
            *nl = 0;
            set->offset += (nl - line) + 1;
            progressed = 1;
            unsigned gpu, gi, ci;
            unsigned long long type, edata, ts;
            if (sscanf(line, "E %u %llu %llu %u %u %llu", &gpu, &type, &edata, &gi, &ci, &ts) == 6) {
                if (gpu < MOCK_MAX_GPUS && (set->mask[gpu] & type)) {
                    memset(data, 0, sizeof *data);
                    data->device = &g_dev_handles[gpu];
                    data->eventType = type;
                    data->eventData = edata;
                    data->gpuInstanceId = gi;
                    data->computeInstanceId = ci;
                    *rc = NVML_SUCCESS;
                    found = 1;
                }
            } else if (sscanf(line, "L %u %llu", &gpu, &ts) == 2) {
                if (gpu < MOCK_MAX_GPUS && set->mask[gpu]) {
                    memset(data, 0, sizeof *data);
                    data->device = &g_dev_handles[gpu];
                    *rc = NVML_ERROR_GPU_IS_LOST;
                    found = 1;
                }
            }
            line = nl + 1;
        }
        if (!progressed)
            break; /* a partial line: its writer is not done yet */
    }
    close(fd);
    return found;
}

/* A fault on a GPU this set watches (called with g_mu held): 1 and *rc, *data filled in. */
static int event_fault(nvmlEventSet_t set, nvmlEventData_t *data, nvmlReturn_t *rc)
{
    if (state_refresh() != NVML_SUCCESS)
        return 0; /* a broken state file is reported by the calls that need it */
    for (unsigned g = 0; g < g_prof.ngpu; g++) {
        if (!set->mask[g])
            continue;
        switch (g_state.gpu[g].events) {
        case MOCK_EVENTS_TIMEOUT:
            *rc = NVML_ERROR_TIMEOUT;
            return 1;
        case MOCK_EVENTS_SPURIOUS:
            memset(data, 0, sizeof *data);
            data->device = &g_dev_handles[g];
            data->eventType = nvmlEventTypePState;
            data->gpuInstanceId = data->computeInstanceId = MOCK_NO_ID;
            *rc = NVML_SUCCESS;
            return 1;
        default:
            break;
        }
    }
    return 0;
}

static long long now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static nvmlReturn_t wait_impl(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeoutms)
{
    if (!data || !set_ok(set))
        return NVML_ERROR_INVALID_ARGUMENT;
    long long deadline = now_ms() + timeoutms;
    for (;;) {
        pthread_mutex_lock(&g_mu);
        unsigned initialised = g_refcount;
        nvmlReturn_t rc = NVML_SUCCESS;
        int found = initialised ? scan(set, data, &rc) || event_fault(set, data, &rc) : 0;
        pthread_mutex_unlock(&g_mu);
        if (!initialised)
            return NVML_ERROR_UNINITIALIZED;
        if (found)
            return rc;
        long long left = deadline - now_ms();
        if (left <= 0)
            return NVML_ERROR_TIMEOUT;
        if (set->ifd >= 0) {
            struct pollfd p = {set->ifd, POLLIN, 0};
            int r = poll(&p, 1, (int)(left < 250 ? left : 250));
            if (r > 0) {
                char drain[4096];
                while (read(set->ifd, drain, sizeof drain) > 0) {
                }
            }
        } else {
            struct timespec ts = {0, 10 * 1000000L};
            nanosleep(&ts, NULL);
        }
    }
}
EXPORT nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeoutms)
{
    return wait_impl(set, data, timeoutms);
}
EXPORT nvmlReturn_t nvmlEventSetWait(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeoutms)
{
    return wait_impl(set, data, timeoutms);
}

/* Append one event line; called with the state lock held. */
nvmlReturn_t mock_emit(const char *kind, unsigned gpu, unsigned long long type,
                       unsigned long long edata, unsigned gi, unsigned ci)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    unsigned long long ns = (unsigned long long)ts.tv_sec * 1000000000ULL + (unsigned long long)ts.tv_nsec;
    char line[160];
    if (kind[0] == 'L')
        snprintf(line, sizeof line, "L %u %llu\n", gpu, ns);
    else
        snprintf(line, sizeof line, "E %u %llu %llu %u %u %llu\n", gpu, type, edata, gi, ci, ns);
    return events_append(line);
}
