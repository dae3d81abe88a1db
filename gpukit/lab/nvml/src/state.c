/*
 * gpukit mock NVML: persistent device state.
 *
 * $STATE_DIR/state   the device state, a line-oriented text file (format below). Written only by
 *                    this library: under an exclusive flock on $STATE_DIR/lock, to state.tmp,
 *                    fsync, rename over state, fsync the directory. Readers never lock: rename is
 *                    atomic, so a reader sees the old or the new state, never half of one, and a
 *                    writer killed at any point leaves the previous state in place.
 * $STATE_DIR/events  append-only event log (XIDs, lost GPUs) that event sets follow (events.c);
 *                    its first line is a header unique to this log (a boot starts a new one).
 *
 * State file format, version 1 (one record per line, space separated, '#' comments):
 *   gpukit-nvml-state 1
 *   serial N                                  bumps on every write
 *   boot NS                                   CLOCK_REALTIME of the last boot (energy counts from it)
 *   gpu IDX uuid UUID mig CUR pending PEND lost 0|1 counter N [events timeout|spurious]
 *       [energy MJ] [sbe N dbe N sbe_agg N dbe_agg N] [remap_pending 1]   telemetry counters
 *       [compute_mode M minor N]              nvmlComputeMode_t when not DEFAULT (0), with the
 *                                              GPU's minor for readers without the profile (the
 *                                              lab workload refuses a 2nd EXCLUSIVE_PROCESS client)
 *   gi IDX GI_ID profile P start S size Z      a GPU instance (placement in memory slices; P is
 *                                              the NVML_GPU_INSTANCE_PROFILE_* constant, not the
 *                                              driver's profile id NVML reports)
 *   ci IDX GI_ID CI_ID profile P start S size Z uuid MIG-...   a compute instance
 *   proc IDX PID bytes B gi GI|- ci CI|- name NAME [util U since NS]   a process using the GPU
 * `events` (a fault injected by gpukitMockSetEventFault) is written only when it is not `normal`.
 * A `gpu` record whose uuid is not the profile's GPU at that index is ignored with everything
 * that follows for it: the state belongs to a physical GPU, not to an index.
 */
#include "mock.h"

#include <errno.h>
#include <stdarg.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define STATE_MAGIC "gpukit-nvml-state"
#define STATE_VERSION 1

const char *const mock_events_modes[MOCK_EVENTS_MODES] = {"normal", "timeout", "spurious"};

static int parse_events_mode(const char *s, unsigned *out)
{
    for (unsigned i = 0; i < MOCK_EVENTS_MODES; i++)
        if (!strcmp(s, mock_events_modes[i])) {
            *out = i;
            return 0;
        }
    return -1;
}

void state_defaults(mock_state *s)
{
    s->serial = 0;
    for (unsigned i = 0; i < g_prof.ngpu; i++) {
        mock_gpu_state *gs = &s->gpu[i];
        memset(gs, 0, sizeof *gs);
        gs->mig_current = gs->mig_pending =
            (g_prof.gpu[i].mig && g_prof.gpu[i].mig_enabled) ? NVML_DEVICE_MIG_ENABLE
                                                             : NVML_DEVICE_MIG_DISABLE;
    }
}

unsigned mock_gi_count(const mock_gpu_state *gs)
{
    unsigned n = 0;
    for (unsigned g = 0; g < MOCK_MAX_GI; g++)
        n += gs->gi[g].used != 0;
    return n;
}

int mock_gpu_busy(const mock_gpu_state *gs) { return mock_gpu_busy_index((unsigned)(gs - g_state.gpu)); }

void mock_apply_reset(unsigned gpu)
{
    mock_gpu_state *gs = &g_state.gpu[gpu];
    gs->mig_current = gs->mig_pending;
    memset(gs->gi, 0, sizeof gs->gi); /* instances do not survive a GPU reset */
}

static nvmlReturn_t errno_rc(int e)
{
    switch (e) {
    case EACCES:
    case EPERM:
    case EROFS: return NVML_ERROR_NO_PERMISSION;
    case ENOSPC:
    case ENOMEM: return NVML_ERROR_MEMORY;
    default: return NVML_ERROR_UNKNOWN;
    }
}

static void state_path(char *out, size_t n, const char *leaf)
{
    snprintf(out, n, "%s/%s", g_state_dir, leaf);
}

/* ---- parsing ---- */
static int parse_id(const char *s, unsigned *out)
{
    if (!strcmp(s, "-")) {
        *out = MOCK_NO_ID;
        return 0;
    }
    char *end;
    unsigned long v = strtoul(s, &end, 10);
    if (!*s || *end || v > 0xFFFFFFFEul)
        return -1;
    *out = (unsigned)v;
    return 0;
}

static int parse_ull(const char *s, unsigned long long *out)
{
    char *end;
    errno = 0;
    *out = strtoull(s, &end, 10);
    return (!*s || *end || errno) ? -1 : 0;
}

/* key/value lookup among tokens tok[first..n) laid out as k v k v ... */
static const char *kv(char **tok, int n, int first, const char *key)
{
    for (int i = first; i + 1 < n; i += 2)
        if (!strcmp(tok[i], key))
            return tok[i + 1];
    return NULL;
}

static int kv_u(char **tok, int n, int first, const char *key, unsigned *out)
{
    const char *v = kv(tok, n, first, key);
    return v ? parse_id(v, out) : -1;
}

static int bad_line(char *err, size_t n, int lineno, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static int bad_line(char *err, size_t n, int lineno, const char *fmt, ...)
{
    int k = snprintf(err, n, "line %d: ", lineno);
    va_list ap;
    va_start(ap, fmt);
    if (k > 0 && (size_t)k < n)
        vsnprintf(err + k, n - (size_t)k, fmt, ap);
    va_end(ap);
    return -1;
}

static int parse_state(char *text, mock_state *s, char *err, size_t errlen)
{
    int skip[MOCK_MAX_GPUS];
    for (unsigned i = 0; i < MOCK_MAX_GPUS; i++)
        skip[i] = 1; /* until a matching `gpu` record */
    int lineno = 0, have_magic = 0;
    char *save = NULL;
    for (char *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        lineno++;
        char *tok[32];
        int n = 0;
        char *ts = NULL;
        for (char *t = strtok_r(line, " \t\r", &ts); t && n < 32; t = strtok_r(NULL, " \t\r", &ts))
            tok[n++] = t;
        if (n == 0 || tok[0][0] == '#')
            continue;
#define BAD(...) return bad_line(err, errlen, lineno, __VA_ARGS__)
        if (!have_magic) {
            if (strcmp(tok[0], STATE_MAGIC) || n < 2 || atoi(tok[1]) != STATE_VERSION)
                BAD("not a gpukit mock NVML state file (version %d)", STATE_VERSION);
            have_magic = 1;
            continue;
        }
        unsigned idx;
        if (!strcmp(tok[0], "boot")) {
            if (n < 2 || parse_ull(tok[1], &s->boot_ns))
                BAD("bad boot record");
            continue;
        }
        if (!strcmp(tok[0], "serial")) {
            if (n < 2 || parse_ull(tok[1], &s->serial))
                BAD("bad serial record");
            continue;
        }
        if (n < 2 || parse_id(tok[1], &idx) || idx == MOCK_NO_ID)
            BAD("bad record '%s'", tok[0]);
        if (!strcmp(tok[0], "gpu")) {
            const char *uuid = kv(tok, n, 2, "uuid");
            if (!uuid)
                BAD("gpu record without uuid");
            if (idx >= g_prof.ngpu || strcmp(uuid, g_prof.gpu[idx].uuid))
                continue; /* another GPU (profile changed): not this GPU's state */
            mock_gpu_state *gs = &s->gpu[idx];
            unsigned lost;
            const char *ctr = kv(tok, n, 2, "counter"), *events = kv(tok, n, 2, "events");
            if (kv_u(tok, n, 2, "mig", &gs->mig_current) ||
                kv_u(tok, n, 2, "pending", &gs->mig_pending) || kv_u(tok, n, 2, "lost", &lost) ||
                !ctr || parse_ull(ctr, &gs->mig_counter) || gs->mig_current > 1 ||
                gs->mig_pending > 1 || (events && parse_events_mode(events, &gs->events)))
                BAD("bad gpu record");
            if (!g_prof.gpu[idx].mig)
                gs->mig_current = gs->mig_pending = NVML_DEVICE_MIG_DISABLE;
            static const char *const counters[] = {"energy", "sbe", "dbe", "sbe_agg", "dbe_agg"};
            unsigned long long *dst[] = {&gs->energy_mj, &gs->sbe_vol, &gs->dbe_vol, &gs->sbe_agg,
                                         &gs->dbe_agg};
            for (size_t k = 0; k < sizeof counters / sizeof counters[0]; k++) {
                const char *v = kv(tok, n, 2, counters[k]);
                if (v && parse_ull(v, dst[k]))
                    BAD("bad gpu record: %s", counters[k]);
            }
            if (kv(tok, n, 2, "remap_pending") && kv_u(tok, n, 2, "remap_pending", &gs->remap_pending))
                BAD("bad gpu record: remap_pending");
            if (kv(tok, n, 2, "compute_mode") &&
                (kv_u(tok, n, 2, "compute_mode", &gs->compute_mode) ||
                 gs->compute_mode > NVML_COMPUTEMODE_EXCLUSIVE_PROCESS))
                BAD("bad gpu record: compute_mode");
            gs->lost = lost != 0;
            skip[idx] = 0;
            continue;
        }
        if (idx >= MOCK_MAX_GPUS || skip[idx])
            continue;
        mock_gpu_state *gs = &s->gpu[idx];
        const mock_mig_table *t = g_prof.gpu[idx].mig;
        if (!strcmp(tok[0], "gi")) {
            unsigned id, prof, start, size;
            if (n < 3 || parse_id(tok[2], &id) || id >= MOCK_MAX_GI ||
                kv_u(tok, n, 3, "profile", &prof) || kv_u(tok, n, 3, "start", &start) ||
                kv_u(tok, n, 3, "size", &size))
                BAD("bad gi record");
            if (!mig_gi_profile(t, prof))
                BAD("GPU %u has no GPU-instance profile %u", idx, prof);
            mock_gi_state *gi = &gs->gi[id];
            memset(gi, 0, sizeof *gi);
            gi->used = 1;
            gi->profile_id = prof;
            gi->start = start;
            gi->size = size;
        } else if (!strcmp(tok[0], "ci")) {
            unsigned gid, cid, prof, start, size;
            const char *uuid = kv(tok, n, 4, "uuid");
            if (n < 4 || parse_id(tok[2], &gid) || gid >= MOCK_MAX_GI || parse_id(tok[3], &cid) ||
                cid >= MOCK_MAX_CI || kv_u(tok, n, 4, "profile", &prof) ||
                kv_u(tok, n, 4, "start", &start) || kv_u(tok, n, 4, "size", &size) || !uuid ||
                strlen(uuid) >= NVML_DEVICE_UUID_V2_BUFFER_SIZE)
                BAD("bad ci record");
            if (!gs->gi[gid].used)
                BAD("ci record for GPU instance %u that does not exist", gid);
            mock_ci_state *ci = &gs->gi[gid].ci[cid];
            ci->used = 1;
            ci->profile_id = prof;
            ci->start = start;
            ci->size = size;
            snprintf(ci->uuid, sizeof ci->uuid, "%s", uuid);
        } else if (!strcmp(tok[0], "proc")) {
            if (gs->nproc >= MOCK_MAX_PROCS)
                BAD("too many processes for GPU %u", idx);
            mock_proc *p = &gs->proc[gs->nproc];
            memset(p, 0, sizeof *p);
            const char *bytes = kv(tok, n, 3, "bytes"), *name = kv(tok, n, 3, "name");
            if (n < 3 || parse_id(tok[2], &p->pid) || !bytes || parse_ull(bytes, &p->used_bytes) ||
                kv_u(tok, n, 3, "gi", &p->gi) || kv_u(tok, n, 3, "ci", &p->ci))
                BAD("bad proc record");
            if (name && strcmp(name, "-"))
                snprintf(p->name, sizeof p->name, "%s", name);
            const char *since = kv(tok, n, 3, "since");
            if ((kv(tok, n, 3, "util") && (kv_u(tok, n, 3, "util", &p->util) || p->util > 100)) ||
                (since && parse_ull(since, &p->since_ns)))
                BAD("bad proc record");
            gs->nproc++;
        } else {
            BAD("unknown record '%s'", tok[0]);
        }
#undef BAD
    }
    if (!have_magic) {
        snprintf(err, errlen, "empty state file");
        return -1;
    }
    return 0;
}

nvmlReturn_t state_refresh(void)
{
    char path[PATH_MAX + 16];
    state_path(path, sizeof path, "state");
    state_defaults(&g_state);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        if (errno == ENOENT || errno == ENOTDIR)
            return NVML_SUCCESS; /* fresh GPUs: defaults from the profile */
        mock_report_error("%s: %s", path, strerror(errno));
        return errno_rc(errno);
    }
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap);
    for (;;) {
        if (!buf) {
            close(fd);
            return NVML_ERROR_MEMORY;
        }
        ssize_t r = read(fd, buf + len, cap - len - 1);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            free(buf);
            close(fd);
            return NVML_ERROR_UNKNOWN;
        }
        if (r == 0)
            break;
        len += (size_t)r;
        if (len + 1 >= cap) {
            cap *= 2;
            char *nb = realloc(buf, cap);
            if (!nb)
                free(buf);
            buf = nb;
        }
    }
    close(fd);
    buf[len] = 0;
    char err[256];
    int bad = parse_state(buf, &g_state, err, sizeof err);
    free(buf);
    if (bad) {
        static char last[PATH_MAX + 600];
        char msg[sizeof last];
        snprintf(msg, sizeof msg, "%s: corrupt state (%s); remove it to start from fresh GPUs",
                 path, err);
        if (strcmp(msg, last)) { /* say it once, not on every call */
            snprintf(last, sizeof last, "%s", msg);
            mock_report_error("%s", msg);
        }
        state_defaults(&g_state);
        return NVML_ERROR_CORRUPTED_INFOROM;
    }
    return NVML_SUCCESS;
}

static int mkdir_p(const char *dir)
{
    char tmp[PATH_MAX];
    snprintf(tmp, sizeof tmp, "%s", dir);
    for (char *p = tmp + 1; *p; p++)
        if (*p == '/') {
            *p = 0;
            if (mkdir(tmp, 0755) && errno != EEXIST)
                return -1;
            *p = '/';
        }
    if (mkdir(tmp, 0755) && errno != EEXIST)
        return -1;
    return 0;
}

nvmlReturn_t state_lock(int *fd)
{
    char path[PATH_MAX + 16];
    if (mkdir_p(g_state_dir)) {
        mock_report_error("cannot create the state directory %s: %s", g_state_dir,
                          strerror(errno));
        return errno_rc(errno);
    }
    state_path(path, sizeof path, "lock");
    *fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (*fd < 0) {
        mock_report_error("%s: %s", path, strerror(errno));
        return errno_rc(errno);
    }
    while (flock(*fd, LOCK_EX) < 0) {
        if (errno != EINTR) {
            close(*fd);
            return NVML_ERROR_UNKNOWN;
        }
    }
    nvmlReturn_t rc = state_refresh();
    if (rc != NVML_SUCCESS)
        state_unlock(*fd);
    else
        caps_repair(); /* a writer killed before it rebuilt the capability files */
    return rc;
}

void state_unlock(int fd)
{
    flock(fd, LOCK_UN);
    close(fd);
}

static void serialize(FILE *m)
{
    fprintf(m, "%s %d\n", STATE_MAGIC, STATE_VERSION);
    fprintf(m, "# gpukit mock NVML device state: written by libnvidia-ml.so.1, do not edit\n");
    fprintf(m, "serial %llu\n", g_state.serial);
    if (g_state.boot_ns)
        fprintf(m, "boot %llu\n", g_state.boot_ns);
    for (unsigned i = 0; i < g_prof.ngpu; i++) {
        const mock_gpu_state *gs = &g_state.gpu[i];
        fprintf(m, "gpu %u uuid %s mig %u pending %u lost %d counter %llu", i,
                g_prof.gpu[i].uuid, gs->mig_current, gs->mig_pending, gs->lost, gs->mig_counter);
        if (gs->events != MOCK_EVENTS_NORMAL && gs->events < MOCK_EVENTS_MODES)
            fprintf(m, " events %s", mock_events_modes[gs->events]);
        if (gs->energy_mj)
            fprintf(m, " energy %llu", gs->energy_mj);
        if (gs->sbe_agg || gs->dbe_agg)
            fprintf(m, " sbe %llu dbe %llu sbe_agg %llu dbe_agg %llu", gs->sbe_vol, gs->dbe_vol,
                    gs->sbe_agg, gs->dbe_agg);
        if (gs->remap_pending)
            fprintf(m, " remap_pending 1");
        if (gs->compute_mode)
            fprintf(m, " compute_mode %u minor %u", gs->compute_mode, g_prof.gpu[i].minor);
        fputc('\n', m);
        for (unsigned g = 0; g < MOCK_MAX_GI; g++) {
            const mock_gi_state *gi = &gs->gi[g];
            if (!gi->used)
                continue;
            fprintf(m, "gi %u %u profile %u start %u size %u\n", i, g, gi->profile_id, gi->start,
                    gi->size);
            for (unsigned c = 0; c < MOCK_MAX_CI; c++) {
                const mock_ci_state *ci = &gi->ci[c];
                if (ci->used)
                    fprintf(m, "ci %u %u %u profile %u start %u size %u uuid %s\n", i, g, c,
                            ci->profile_id, ci->start, ci->size, ci->uuid);
            }
        }
        for (unsigned p = 0; p < gs->nproc; p++) {
            const mock_proc *pr = &gs->proc[p];
            char gi[16] = "-", ci[16] = "-";
            if (pr->gi != MOCK_NO_ID)
                snprintf(gi, sizeof gi, "%u", pr->gi);
            if (pr->ci != MOCK_NO_ID)
                snprintf(ci, sizeof ci, "%u", pr->ci);
            fprintf(m, "proc %u %u bytes %llu gi %s ci %s name %s util %u since %llu\n", i, pr->pid,
                    pr->used_bytes, gi, ci, pr->name[0] ? pr->name : "-", pr->util, pr->since_ns);
        }
    }
}

static int write_all(int fd, const char *p, size_t n)
{
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0)
            return -1;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

nvmlReturn_t state_commit(int lockfd)
{
    char tmp[PATH_MAX + 16], final[PATH_MAX + 16];
    state_path(tmp, sizeof tmp, "state.tmp");
    state_path(final, sizeof final, "state");
    g_state.serial++;
    mock_fold_dead_clients(); /* finished lab workloads: their energy into the counter */
    char *buf = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&buf, &len);
    if (!m) {
        state_unlock(lockfd);
        return NVML_ERROR_MEMORY;
    }
    serialize(m);
    fclose(m);
    nvmlReturn_t rc = NVML_SUCCESS;
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        rc = errno_rc(errno);
        mock_report_error("%s: %s", tmp, strerror(errno));
        goto out;
    }
    /* Test hook: stall half way through writing so a test can SIGKILL us mid-change. */
    const char *delay = getenv("GPUKIT_NVML_TEST_COMMIT_DELAY_MS");
    size_t half = delay ? len / 2 : len;
    if (write_all(fd, buf, half)) {
        rc = errno_rc(errno);
        close(fd);
        goto out;
    }
    if (delay) {
        struct timespec ts = {atoi(delay) / 1000, (long)(atoi(delay) % 1000) * 1000000L};
        nanosleep(&ts, NULL);
    }
    if (write_all(fd, buf + half, len - half) || fsync(fd)) {
        rc = errno_rc(errno);
        close(fd);
        goto out;
    }
    close(fd);
    if (rename(tmp, final)) {
        rc = errno_rc(errno);
        goto out;
    }
    int dfd = open(g_state_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
        fsync(dfd);
        close(dfd);
    }
    /* The state landed: the driver's capability files follow it (an error there is reported,
     * and repaired by the next writer; the change itself stands). */
    caps_render();
    mock_unlink_folded_clients(); /* only once the energy they carried is in the state */
out:
    free(buf);
    state_unlock(lockfd);
    if (rc != NVML_SUCCESS)
        state_refresh(); /* drop the in-memory change that did not land */
    return rc;
}

/* Called with the state lock held, so records are ordered like the changes they describe. */
nvmlReturn_t events_append(const char *line)
{
    char path[PATH_MAX + 16];
    state_path(path, sizeof path, "events");
    int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0)
        return errno_rc(errno);
    struct stat st;
    int bad = 0;
    if (fstat(fd, &st) == 0 && st.st_size == 0) {
        /* A new log: its header names it, so event sets notice a log that was started anew. */
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        char head[96];
        snprintf(head, sizeof head, "# gpukit-nvml-events %lld.%09ld %d\n", (long long)ts.tv_sec,
                 ts.tv_nsec, (int)getpid());
        bad = write_all(fd, head, strlen(head));
    }
    bad = bad || write_all(fd, line, strlen(line));
    close(fd);
    return bad ? NVML_ERROR_UNKNOWN : NVML_SUCCESS;
}

void events_truncate(void)
{
    char path[PATH_MAX + 16];
    state_path(path, sizeof path, "events");
    if (truncate(path, 0) && errno != ENOENT)
        mock_report_error("%s: %s", path, strerror(errno));
}

/* ---- JSON status (for `python -m gpukit.lab.nvml status`) ---- */
static void json_str(FILE *m, const char *s)
{
    fputc('"', m);
    for (; *s; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\')
            fprintf(m, "\\%c", ch);
        else if (ch < 0x20)
            fprintf(m, "\\u%04x", ch);
        else
            fputc(ch, m);
    }
    fputc('"', m);
}

static void json_id(FILE *m, unsigned id)
{
    if (id == MOCK_NO_ID)
        fputs("null", m);
    else
        fprintf(m, "%u", id);
}

char *mock_status_json(size_t *len)
{
    char *buf = NULL;
    FILE *m = open_memstream(&buf, len);
    if (!m)
        return NULL;
    fputs("{\"profile\": ", m);
    json_str(m, g_prof.name);
    fputs(", \"profile_path\": ", m);
    json_str(m, g_prof.path);
    fputs(", \"state_dir\": ", m);
    json_str(m, g_state_dir);
    fputs(", \"seed\": ", m);
    json_str(m, g_prof.seed);
    fputs(", \"driver_version\": ", m);
    json_str(m, g_prof.driver_version);
    fprintf(m, ", \"cuda_driver_version\": %d, \"serial\": %llu, \"gpus\": [", g_prof.cuda_version,
            g_state.serial);
    for (unsigned i = 0; i < g_prof.ngpu; i++) {
        const mock_gpu *p = &g_prof.gpu[i];
        const mock_gpu_state *gs = &g_state.gpu[i];
        fprintf(m, "%s{\"index\": %u, \"name\": ", i ? ", " : "", i);
        json_str(m, p->name);
        fputs(", \"uuid\": ", m);
        json_str(m, p->uuid);
        fputs(", \"pci_bus_id\": ", m);
        json_str(m, p->pci_bus_id);
        fprintf(m, ", \"lost\": %s, \"events\": \"%s\", \"mig\": ", gs->lost ? "true" : "false",
                mock_events_modes[gs->events < MOCK_EVENTS_MODES ? gs->events : 0]);
        if (!p->mig) {
            fputs("null", m);
        } else {
            fputs("{\"table\": ", m);
            json_str(m, p->mig->key);
            fprintf(m, ", \"current\": %s, \"pending\": %s, \"gpu_instances\": [",
                    gs->mig_current ? "true" : "false", gs->mig_pending ? "true" : "false");
            int first = 1;
            for (unsigned g = 0; g < MOCK_MAX_GI; g++) {
                const mock_gi_state *gi = &gs->gi[g];
                if (!gi->used)
                    continue;
                const mock_gi_profile *gp = mig_gi_profile(p->mig, gi->profile_id);
                fprintf(m, "%s{\"id\": %u, \"profile\": ", first ? "" : ", ", g);
                json_str(m, gp ? gp->name : "?");
                fprintf(m,
                        ", \"profile_id\": %u, \"driver_profile_id\": %u, \"placement\": "
                        "{\"start\": %u, \"size\": %u}, \"compute_instances\": [",
                        gi->profile_id, gp ? gp->driver_id : MOCK_NO_ID, gi->start, gi->size);
                first = 0;
                int cfirst = 1;
                for (unsigned c = 0; c < MOCK_MAX_CI; c++) {
                    const mock_ci_state *ci = &gi->ci[c];
                    if (!ci->used)
                        continue;
                    fprintf(m,
                            "%s{\"id\": %u, \"profile_id\": %u, \"placement\": {\"start\": %u, "
                            "\"size\": %u}, \"uuid\": ",
                            cfirst ? "" : ", ", c, ci->profile_id, ci->start, ci->size);
                    json_str(m, ci->uuid);
                    fputc('}', m);
                    cfirst = 0;
                }
                fputs("]}", m);
            }
            fputs("]}", m);
        }
        fputs(", \"processes\": [", m);
        for (unsigned k = 0; k < gs->nproc; k++) {
            const mock_proc *pr = &gs->proc[k];
            fprintf(m, "%s{\"pid\": %u, \"used_memory_bytes\": %llu, \"gpu_instance_id\": ",
                    k ? ", " : "", pr->pid, pr->used_bytes);
            json_id(m, pr->gi);
            fputs(", \"compute_instance_id\": ", m);
            json_id(m, pr->ci);
            fputs(", \"name\": ", m);
            json_str(m, pr->name);
            fputc('}', m);
        }
        fputs("]}", m);
    }
    fputs("]}\n", m);
    fclose(m);
    return buf;
}
