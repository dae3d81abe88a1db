/*
 * gpukit mock NVML: the node's GPU profile (YAML, parsed with libyaml).
 *
 * Every error names the file, the field (as a path such as gpus[3].memory_mib) and the line.
 * See gpukit/lab/profiles/README.md for the format.
 */
#include "mock.h"

#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <yaml.h>

typedef struct {
    yaml_document_t doc;
    const char *file;
    int failed;
} yctx;

static int fail(yctx *c, const yaml_node_t *n, const char *field, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static int fail(yctx *c, const yaml_node_t *n, const char *field, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (!c->failed) {
        if (n)
            mock_report_error("%s: %s: %s (line %lu)", c->file, field, msg,
                              (unsigned long)n->start_mark.line + 1);
        else
            mock_report_error("%s: %s: %s", c->file, field, msg);
    }
    c->failed = 1;
    return -1;
}

static const char *scalar(const yaml_node_t *n)
{
    return (n && n->type == YAML_SCALAR_NODE) ? (const char *)n->data.scalar.value : NULL;
}

static int get_str(yctx *c, const yaml_node_t *n, const char *field, char *out, size_t size)
{
    const char *s = scalar(n);
    if (!s)
        return fail(c, n, field, "expected a string");
    if (strlen(s) >= size)
        return fail(c, n, field, "too long (at most %zu characters)", size - 1);
    memcpy(out, s, strlen(s) + 1);
    return 0;
}

static int get_uint(yctx *c, const yaml_node_t *n, const char *field, unsigned long long max,
                    unsigned long long *out)
{
    const char *s = scalar(n);
    if (!s || !*s)
        return fail(c, n, field, "expected a non-negative integer");
    int base = (s[0] == '0' && (s[1] == 'x' || s[1] == 'X')) ? 16 : 10;
    const char *digits = base == 16 ? s + 2 : s;
    int ok = *digits != 0;
    for (const char *p = digits; ok && *p; p++)
        ok = base == 16 ? isxdigit((unsigned char)*p) : isdigit((unsigned char)*p);
    if (!ok)
        return fail(c, n, field, "expected a non-negative integer, got '%s'", s);
    errno = 0;
    unsigned long long v = strtoull(digits, NULL, base);
    if (errno || v > max)
        return fail(c, n, field, "%s is out of range (at most %llu)", s, max);
    *out = v;
    return 0;
}

static int get_u32(yctx *c, const yaml_node_t *n, const char *field, unsigned max, unsigned *out)
{
    unsigned long long v;
    if (get_uint(c, n, field, max, &v))
        return -1;
    *out = (unsigned)v;
    return 0;
}

static int get_bool(yctx *c, const yaml_node_t *n, const char *field, int *out)
{
    const char *s = scalar(n);
    if (s && (!strcasecmp(s, "true") || !strcasecmp(s, "yes") || !strcasecmp(s, "on"))) {
        *out = 1;
        return 0;
    }
    if (s && (!strcasecmp(s, "false") || !strcasecmp(s, "no") || !strcasecmp(s, "off"))) {
        *out = 0;
        return 0;
    }
    return fail(c, n, field, "expected true or false, got '%s'", s ? s : "(not a scalar)");
}

static int parse_cpus(yctx *c, const yaml_node_t *n, const char *field, unsigned long *mask)
{
    const char *s = scalar(n);
    if (!s || !*s)
        return fail(c, n, field, "expected a CPU list such as \"0-63,128-191\"");
    memset(mask, 0, MOCK_CPU_WORDS * sizeof(unsigned long));
    const char *p = s;
    while (*p) {
        char *end;
        unsigned long a = strtoul(p, &end, 10), b = a;
        if (end == p)
            return fail(c, n, field, "bad CPU list '%s'", s);
        p = end;
        if (*p == '-') {
            p++;
            b = strtoul(p, &end, 10);
            if (end == p)
                return fail(c, n, field, "bad CPU list '%s'", s);
            p = end;
        }
        if (b < a || b >= MOCK_MAX_CPUS)
            return fail(c, n, field, "bad CPU range in '%s' (CPUs 0..%d)", s, MOCK_MAX_CPUS - 1);
        for (unsigned long i = a; i <= b; i++)
            mask[i / (8 * sizeof(unsigned long))] |= 1UL << (i % (8 * sizeof(unsigned long)));
        if (*p == ',')
            p++;
        else if (*p)
            return fail(c, n, field, "bad CPU list '%s'", s);
    }
    return 0;
}

/* A PCI bus id, `DDDDDDDD:BB:DD.F` or `BB:DD.F`, stored as NVML writes it (function 0). */
static int get_bus_id(yctx *c, const yaml_node_t *v, const char *f,
                      char out[NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE], unsigned *domain,
                      unsigned *bus_out, unsigned *device)
{
    char tmp[64];
    if (get_str(c, v, f, tmp, sizeof tmp))
        return -1;
    unsigned dom = 0, bus, dev, fn = 0;
    int ok = sscanf(tmp, "%x:%x:%x.%x", &dom, &bus, &dev, &fn) == 4;
    if (!ok) {
        dom = 0;
        ok = sscanf(tmp, "%x:%x.%x", &bus, &dev, &fn) == 3;
    }
    if (!ok || bus > 0xff || dev > 0x1f || fn > 7)
        return fail(c, v, f, "expected a PCI bus id such as 00000000:07:00.0, got '%s'", tmp);
    *domain = dom;
    *bus_out = bus;
    *device = dev;
    snprintf(out, NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE, "%08X:%02X:%02X.0", dom, bus, dev);
    return 0;
}

/* A list of small indexes (nvlink_peers, nvlink_switches) into out[max]. */
static int get_index_list(yctx *c, yaml_node_t *v, const char *f, const char *what,
                          unsigned limit, unsigned max, int *out, unsigned *n)
{
    if (v->type != YAML_SEQUENCE_NODE)
        return fail(c, v, f, "expected a list of %s indexes", what);
    *n = 0;
    for (yaml_node_item_t *it = v->data.sequence.items.start; it < v->data.sequence.items.top;
         it++) {
        char ff[300];
        snprintf(ff, sizeof ff, "%s[%u]", f, *n);
        if (*n >= max)
            return fail(c, v, f, "at most %u entries", max);
        unsigned u;
        if (get_u32(c, yaml_document_get_node(&c->doc, *it), ff, limit, &u))
            return -1;
        out[(*n)++] = (int)u;
    }
    return 0;
}

/* ---- UUIDs and serials derived from the seed ---- */
static uint64_t fnv1a(const char *s, uint64_t h)
{
    for (; *s; s++) {
        h ^= (unsigned char)*s;
        h *= 0x100000001b3ULL;
    }
    return h;
}

static uint64_t mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

void mock_uuid(char *out, size_t n, const char *prefix, const char *material)
{
    uint64_t a = mix64(fnv1a(material, 0xcbf29ce484222325ULL));
    uint64_t b = mix64(fnv1a(material, 0x84222325cbf29ce4ULL) ^ a);
    snprintf(out, n, "%s%08x-%04x-%04x-%04x-%012llx", prefix, (unsigned)(a >> 32),
             (unsigned)(a >> 16) & 0xffff, (unsigned)a & 0xffff, (unsigned)(b >> 48),
             (unsigned long long)(b & 0xffffffffffffULL));
}

/* ---- GPU fields (valid in `defaults` and in each `gpus[]` entry) ---- */
enum {
    F_NAME = 1 << 0,
    F_PCI_BUS_ID = 1 << 1,
    F_PCI_DEVICE_ID = 1 << 2,
    F_MEMORY = 1 << 3,
    F_CC = 1 << 4,
    F_ARCH = 1 << 5,
    F_UUID = 1 << 6,
    F_SERIAL = 1 << 7,
    F_MINOR = 1 << 8,
    F_NUMA = 1 << 9,
};

static const struct {
    const char *name;
    unsigned value;
} ARCHS[] = {
    {"kepler", NVML_DEVICE_ARCH_KEPLER}, {"maxwell", NVML_DEVICE_ARCH_MAXWELL},
    {"pascal", NVML_DEVICE_ARCH_PASCAL}, {"volta", NVML_DEVICE_ARCH_VOLTA},
    {"turing", NVML_DEVICE_ARCH_TURING}, {"ampere", NVML_DEVICE_ARCH_AMPERE},
    {"ada", NVML_DEVICE_ARCH_ADA},       {"hopper", NVML_DEVICE_ARCH_HOPPER},
    {"blackwell", NVML_DEVICE_ARCH_BLACKWELL},
};

static const struct {
    const char *name;
    unsigned value;
} BRANDS[] = {
    {"nvidia", NVML_BRAND_NVIDIA},   {"tesla", NVML_BRAND_TESLA},
    {"quadro", NVML_BRAND_QUADRO},   {"geforce", NVML_BRAND_GEFORCE},
    {"titan", NVML_BRAND_TITAN},     {"nvidia_rtx", NVML_BRAND_NVIDIA_RTX},
    {"unknown", NVML_BRAND_UNKNOWN},
};

/* nvlink_version: "MAJOR.MINOR" as NVIDIA names the versions, or a generation (4 = 4.0); stored
 * as nvmlDeviceGetNvLinkVersion answers it, an nvmlNvlinkVersion_t */
static const struct {
    const char *name;
    unsigned value;
} NVLINK_VERSIONS[] = {
    {"1.0", NVML_NVLINK_VERSION_1_0}, {"2.0", NVML_NVLINK_VERSION_2_0},
    {"2.2", NVML_NVLINK_VERSION_2_2}, {"3.0", NVML_NVLINK_VERSION_3_0},
    {"3.1", NVML_NVLINK_VERSION_3_1}, {"4.0", NVML_NVLINK_VERSION_4_0},
    {"5.0", NVML_NVLINK_VERSION_5_0}, {"6.0", NVML_NVLINK_VERSION_6_0},
};

static int get_nvlink_version(yctx *c, const yaml_node_t *n, const char *field, unsigned *out)
{
    const char *s = scalar(n);
    char name[8];
    if (s && strlen(s) == 1 && isdigit((unsigned char)s[0]))
        snprintf(name, sizeof name, "%s.0", s);
    else
        snprintf(name, sizeof name, "%.7s", s ? s : "");
    for (size_t i = 0; s && i < sizeof NVLINK_VERSIONS / sizeof NVLINK_VERSIONS[0]; i++)
        if (!strcmp(name, NVLINK_VERSIONS[i].name)) {
            *out = NVLINK_VERSIONS[i].value;
            return 0;
        }
    return fail(c, n, field,
                "expected an NVLink version (1.0, 2.0, 2.2, 3.0, 3.1, 4.0, 5.0, 6.0, or a "
                "generation such as 4), got '%s'",
                s ? s : "");
}

/* "xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx" (or 32 hex digits) -> the 16 bytes NVML gives */
static int get_fabric_uuid(yctx *c, const yaml_node_t *n, const char *field, unsigned char *out)
{
    const char *s = scalar(n);
    unsigned nbytes = 0;
    int hi = -1;
    for (const char *p = s; p && *p; p++) {
        if (*p == '-')
            continue;
        if (!isxdigit((unsigned char)*p) || nbytes >= NVML_GPU_FABRIC_UUID_LEN)
            return fail(c, n, field, "expected a UUID such as "
                        "\"2b5e2d8c-0f3a-4c71-9a44-6f1e0c7d5b93\", got '%s'", s);
        int v = isdigit((unsigned char)*p) ? *p - '0' : (tolower((unsigned char)*p) - 'a' + 10);
        if (hi < 0) {
            hi = v;
        } else {
            out[nbytes++] = (unsigned char)(hi << 4 | v);
            hi = -1;
        }
    }
    if (!s || nbytes != NVML_GPU_FABRIC_UUID_LEN || hi >= 0)
        return fail(c, n, field, "expected a UUID (16 bytes) such as "
                    "\"2b5e2d8c-0f3a-4c71-9a44-6f1e0c7d5b93\", got '%s'", s ? s : "");
    return 0;
}

static const struct {
    const char *name;
    unsigned value;
} FABRIC_STATES[] = {
    {"not_supported", NVML_GPU_FABRIC_STATE_NOT_SUPPORTED},
    {"not_started", NVML_GPU_FABRIC_STATE_NOT_STARTED},
    {"in_progress", NVML_GPU_FABRIC_STATE_IN_PROGRESS},
    {"completed", NVML_GPU_FABRIC_STATE_COMPLETED},
}, FABRIC_SUMMARIES[] = {
    {"not_supported", NVML_GPU_FABRIC_HEALTH_SUMMARY_NOT_SUPPORTED},
    {"healthy", NVML_GPU_FABRIC_HEALTH_SUMMARY_HEALTHY},
    {"unhealthy", NVML_GPU_FABRIC_HEALTH_SUMMARY_UNHEALTHY},
    {"limited_capacity", NVML_GPU_FABRIC_HEALTH_SUMMARY_LIMITED_CAPACITY},
};

static const char *FABRIC_FIELDS =
    "cluster_uuid, clique_id, state, status, health_mask, health_summary";

/* fabric: {cluster_uuid, clique_id, state, status, health_mask, health_summary}, or none. A GPU's
 * own fabric replaces the one in defaults as a whole. */
static int get_fabric(yctx *c, yaml_node_t *v, const char *field, mock_gpu *g)
{
    g->has_fabric = 0;
    memset(g->fabric_cluster_uuid, 0, sizeof g->fabric_cluster_uuid);
    g->fabric_clique_id = g->fabric_status = g->fabric_health_mask = 0;
    g->fabric_state = NVML_GPU_FABRIC_STATE_COMPLETED;
    g->fabric_health_summary = NVML_GPU_FABRIC_HEALTH_SUMMARY_NOT_SUPPORTED;
    const char *s = scalar(v);
    if (s && (!*s || !strcmp(s, "null") || !strcmp(s, "~") || !strcasecmp(s, "none")))
        return 0;
    if (!v || v->type != YAML_MAPPING_NODE)
        return fail(c, v, field, "expected a mapping (%s) or none", FABRIC_FIELDS);
    int have_uuid = 0;
    for (yaml_node_pair_t *p = v->data.mapping.pairs.start; p < v->data.mapping.pairs.top; p++) {
        const char *ks = scalar(yaml_document_get_node(&c->doc, p->key));
        yaml_node_t *val = yaml_document_get_node(&c->doc, p->value);
        char f[320];
        snprintf(f, sizeof f, "%s.%s", field, ks ? ks : "?");
        if (ks && !strcmp(ks, "cluster_uuid")) {
            if (get_fabric_uuid(c, val, f, g->fabric_cluster_uuid))
                return -1;
            have_uuid = 1;
        } else if (ks && !strcmp(ks, "clique_id")) {
            if (get_u32(c, val, f, 0xffffffffu, &g->fabric_clique_id))
                return -1;
        } else if (ks && !strcmp(ks, "status")) {
            if (get_u32(c, val, f, 999, &g->fabric_status))
                return -1;
        } else if (ks && !strcmp(ks, "health_mask")) {
            if (get_u32(c, val, f, 0xffffffffu, &g->fabric_health_mask))
                return -1;
        } else if (ks && (!strcmp(ks, "state") || !strcmp(ks, "health_summary"))) {
            int state = !strcmp(ks, "state");
            const char *vs = scalar(val);
            size_t n = state ? sizeof FABRIC_STATES / sizeof FABRIC_STATES[0]
                             : sizeof FABRIC_SUMMARIES / sizeof FABRIC_SUMMARIES[0];
            size_t i = 0;
            for (; vs && i < n; i++)
                if (!strcasecmp(vs, state ? FABRIC_STATES[i].name : FABRIC_SUMMARIES[i].name))
                    break;
            if (!vs || i == n)
                return fail(c, val, f, "expected one of %s, got '%s'",
                            state ? "not_supported, not_started, in_progress, completed"
                                  : "not_supported, healthy, unhealthy, limited_capacity",
                            vs ? vs : "");
            if (state)
                g->fabric_state = FABRIC_STATES[i].value;
            else
                g->fabric_health_summary = FABRIC_SUMMARIES[i].value;
        } else {
            return fail(c, val, f, "unknown field (fabric fields: %s)", FABRIC_FIELDS);
        }
    }
    if (!have_uuid)
        return fail(c, v, field, "needs cluster_uuid (16 bytes, UUID form)");
    g->has_fabric = 1;
    return 0;
}

static const char *GPU_FIELDS =
    "name, uuid, serial, pci_bus_id, pci_device_id, pci_subsystem_id, memory_mib, "
    "memory_reserved_mib, compute_capability, architecture, brand, multiprocessors, numa_node, "
    "pcie_switch, minor_number, mig_table, mig_enabled, mig_mode_change, nvlink_version, "
    "nvlink_links, nvlink_peers, nvlink_switches, power_usage_w, power_limit_w, temperature_c, "
    "utilization_gpu, utilization_memory, sm_clock_max_mhz, sm_clock_idle_mhz, mem_clock_mhz, "
    "persistence_mode, vbios_version, board_part_number, "
    "pcie_generation, pcie_width, fabric";

static int gpu_field(yctx *c, const char *key, yaml_node_t *v, const char *path, mock_gpu *g,
                     unsigned *seen)
{
    char f[256];
    snprintf(f, sizeof f, "%s.%s", path, key);
    unsigned u;
    if (!strcmp(key, "name")) {
        *seen |= F_NAME;
        return get_str(c, v, f, g->name, NVML_DEVICE_NAME_BUFFER_SIZE);
    }
    if (!strcmp(key, "uuid")) {
        *seen |= F_UUID;
        if (get_str(c, v, f, g->uuid, sizeof g->uuid))
            return -1;
        if (strncmp(g->uuid, "GPU-", 4) || strlen(g->uuid) != 40)
            return fail(c, v, f, "expected GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx, got '%s'",
                        g->uuid);
        return 0;
    }
    if (!strcmp(key, "serial")) {
        *seen |= F_SERIAL;
        return get_str(c, v, f, g->serial, sizeof g->serial);
    }
    if (!strcmp(key, "pci_bus_id")) {
        *seen |= F_PCI_BUS_ID;
        return get_bus_id(c, v, f, g->pci_bus_id, &g->domain, &g->bus, &g->device);
    }
    if (!strcmp(key, "pci_device_id")) {
        *seen |= F_PCI_DEVICE_ID;
        return get_u32(c, v, f, 0xffffffffu, &g->pci_device_id);
    }
    if (!strcmp(key, "pci_subsystem_id"))
        return get_u32(c, v, f, 0xffffffffu, &g->pci_subsystem_id);
    if (!strcmp(key, "memory_mib")) {
        *seen |= F_MEMORY;
        if (get_uint(c, v, f, 1ULL << 24, &g->memory_mib))
            return -1;
        if (!g->memory_mib)
            return fail(c, v, f, "must be > 0");
        return 0;
    }
    if (!strcmp(key, "memory_reserved_mib"))
        return get_uint(c, v, f, 1ULL << 24, &g->memory_reserved_mib);
    if (!strcmp(key, "compute_capability")) {
        *seen |= F_CC;
        const char *s = scalar(v);
        unsigned a, b;
        char extra;
        if (!s || sscanf(s, "%u.%u%c", &a, &b, &extra) != 2 || a > 99 || b > 9)
            return fail(c, v, f, "expected MAJOR.MINOR such as \"8.0\", got '%s'", s ? s : "");
        g->cc_major = a;
        g->cc_minor = b;
        return 0;
    }
    if (!strcmp(key, "architecture")) {
        *seen |= F_ARCH;
        const char *s = scalar(v);
        for (size_t i = 0; s && i < sizeof ARCHS / sizeof ARCHS[0]; i++)
            if (!strcasecmp(s, ARCHS[i].name)) {
                g->arch = ARCHS[i].value;
                return 0;
            }
        return fail(c, v, f,
                    "unknown architecture '%s' (kepler, maxwell, pascal, volta, turing, ampere, "
                    "ada, hopper, blackwell)",
                    s ? s : "");
    }
    if (!strcmp(key, "brand")) {
        const char *s = scalar(v);
        for (size_t i = 0; s && i < sizeof BRANDS / sizeof BRANDS[0]; i++)
            if (!strcasecmp(s, BRANDS[i].name)) {
                g->brand = BRANDS[i].value;
                return 0;
            }
        return fail(c, v, f,
                    "unknown brand '%s' (nvidia, tesla, quadro, geforce, titan, nvidia_rtx, "
                    "unknown)",
                    s ? s : "");
    }
    if (!strcmp(key, "multiprocessors"))
        return get_u32(c, v, f, 100000, &g->multiprocessors);
    if (!strcmp(key, "numa_node")) {
        *seen |= F_NUMA;
        if (get_u32(c, v, f, 1023, &u))
            return -1;
        g->numa_node = (int)u;
        return 0;
    }
    if (!strcmp(key, "pcie_switch")) {
        if (get_u32(c, v, f, 1023, &u))
            return -1;
        g->pcie_switch = (int)u;
        return 0;
    }
    if (!strcmp(key, "minor_number")) {
        *seen |= F_MINOR;
        return get_u32(c, v, f, 255, &g->minor);
    }
    if (!strcmp(key, "mig_table")) {
        const char *s = scalar(v);
        if (s && (!*s || !strcmp(s, "null") || !strcmp(s, "~") || !strcasecmp(s, "none"))) {
            g->mig = NULL;
            return 0;
        }
        g->mig = s ? mock_mig_table_find(s) : NULL;
        if (!g->mig)
            return fail(c, v, f, "unknown MIG table '%s' (known: %s)", s ? s : "",
                        mock_mig_table_keys());
        return 0;
    }
    if (!strcmp(key, "mig_enabled"))
        return get_bool(c, v, f, &g->mig_enabled);
    if (!strcmp(key, "mig_mode_change")) {
        const char *s = scalar(v);
        if (s && !strcmp(s, "reset"))
            g->mig_immediate = 0;
        else if (s && !strcmp(s, "immediate"))
            g->mig_immediate = 1;
        else
            return fail(c, v, f, "expected reset or immediate, got '%s'", s ? s : "");
        return 0;
    }
    if (!strcmp(key, "nvlink_version"))
        return get_nvlink_version(c, v, f, &g->nvlink_version);
    if (!strcmp(key, "fabric"))
        return get_fabric(c, v, f, g);
    if (!strcmp(key, "nvlink_links"))
        return get_u32(c, v, f, NVML_NVLINK_MAX_LINKS, &g->nvlink_links);
    if (!strcmp(key, "nvlink_peers"))
        return get_index_list(c, v, f, "GPU", MOCK_MAX_GPUS - 1, MOCK_MAX_NVLINK_PEERS,
                              g->nvlink_peers, &g->n_nvlink_peers);
    if (!strcmp(key, "nvlink_switches"))
        return get_index_list(c, v, f, "NVSwitch", MOCK_MAX_NVSWITCHES - 1, NVML_NVLINK_MAX_LINKS,
                              g->nvlink_switches, &g->n_nvlink_switches);
    if (!strcmp(key, "power_usage_w")) {
        if (get_u32(c, v, f, 100000, &u))
            return -1;
        g->power_usage_mw = u * 1000;
        return 0;
    }
    if (!strcmp(key, "power_limit_w")) {
        if (get_u32(c, v, f, 100000, &u))
            return -1;
        g->power_limit_mw = u * 1000;
        return 0;
    }
    if (!strcmp(key, "temperature_c"))
        return get_u32(c, v, f, 200, &g->temperature_c);
    if (!strcmp(key, "utilization_gpu"))
        return get_u32(c, v, f, 100, &g->util_gpu);
    if (!strcmp(key, "utilization_memory"))
        return get_u32(c, v, f, 100, &g->util_mem);
    if (!strcmp(key, "sm_clock_max_mhz"))
        return get_u32(c, v, f, 10000, &g->sm_clock_max_mhz);
    if (!strcmp(key, "sm_clock_idle_mhz"))
        return get_u32(c, v, f, 10000, &g->sm_clock_idle_mhz);
    if (!strcmp(key, "mem_clock_mhz"))
        return get_u32(c, v, f, 20000, &g->mem_clock_mhz);
    if (!strcmp(key, "persistence_mode"))
        return get_bool(c, v, f, &g->persistence);
    if (!strcmp(key, "vbios_version"))
        return get_str(c, v, f, g->vbios, sizeof g->vbios);
    if (!strcmp(key, "board_part_number"))
        return get_str(c, v, f, g->part_number, sizeof g->part_number);
    if (!strcmp(key, "pcie_generation"))
        return get_u32(c, v, f, 8, &g->pcie_gen);
    if (!strcmp(key, "pcie_width"))
        return get_u32(c, v, f, 32, &g->pcie_width);
    return fail(c, v, f, "unknown field (GPU fields: %s)", GPU_FIELDS);
}

static int gpu_mapping(yctx *c, yaml_node_t *m, const char *path, mock_gpu *g, unsigned *seen)
{
    if (!m || m->type != YAML_MAPPING_NODE)
        return fail(c, m, path, "expected a mapping of GPU fields");
    for (yaml_node_pair_t *p = m->data.mapping.pairs.start; p < m->data.mapping.pairs.top; p++) {
        yaml_node_t *k = yaml_document_get_node(&c->doc, p->key);
        yaml_node_t *v = yaml_document_get_node(&c->doc, p->value);
        const char *ks = scalar(k);
        if (!ks)
            return fail(c, k, path, "keys must be strings");
        if (gpu_field(c, ks, v, path, g, seen))
            return -1;
    }
    return 0;
}

static int numa_nodes(yctx *c, yaml_node_t *v, mock_profile *out)
{
    if (v->type != YAML_SEQUENCE_NODE)
        return fail(c, v, "numa_nodes", "expected a list of {id, cpus}");
    for (yaml_node_item_t *it = v->data.sequence.items.start; it < v->data.sequence.items.top;
         it++) {
        char path[64];
        snprintf(path, sizeof path, "numa_nodes[%u]", out->nnuma);
        yaml_node_t *m = yaml_document_get_node(&c->doc, *it);
        if (out->nnuma >= MOCK_MAX_NUMA)
            return fail(c, m, "numa_nodes", "at most %d NUMA nodes", MOCK_MAX_NUMA);
        if (m->type != YAML_MAPPING_NODE)
            return fail(c, m, path, "expected a mapping {id, cpus}");
        mock_numa *nn = &out->numa[out->nnuma];
        int have_id = 0, have_cpus = 0;
        for (yaml_node_pair_t *p = m->data.mapping.pairs.start; p < m->data.mapping.pairs.top;
             p++) {
            const char *ks = scalar(yaml_document_get_node(&c->doc, p->key));
            yaml_node_t *val = yaml_document_get_node(&c->doc, p->value);
            char f[96];
            snprintf(f, sizeof f, "%s.%s", path, ks ? ks : "?");
            unsigned u;
            if (ks && !strcmp(ks, "id")) {
                if (get_u32(c, val, f, 1023, &u))
                    return -1;
                nn->id = (int)u;
                have_id = 1;
            } else if (ks && !strcmp(ks, "cpus")) {
                if (parse_cpus(c, val, f, nn->cpus))
                    return -1;
                have_cpus = 1;
            } else {
                return fail(c, val, f, "unknown field (NUMA node fields: id, cpus)");
            }
        }
        if (!have_id || !have_cpus)
            return fail(c, m, path, "needs both id and cpus");
        out->nnuma++;
    }
    return 0;
}

static int nvswitches(yctx *c, yaml_node_t *v, mock_profile *out)
{
    if (v->type != YAML_SEQUENCE_NODE)
        return fail(c, v, "nvswitches", "expected a list of {pci_bus_id, pci_device_id}");
    for (yaml_node_item_t *it = v->data.sequence.items.start; it < v->data.sequence.items.top;
         it++) {
        char path[64];
        snprintf(path, sizeof path, "nvswitches[%u]", out->nswitch);
        yaml_node_t *m = yaml_document_get_node(&c->doc, *it);
        if (out->nswitch >= MOCK_MAX_NVSWITCHES)
            return fail(c, m, "nvswitches", "at most %d NVSwitches", MOCK_MAX_NVSWITCHES);
        if (m->type != YAML_MAPPING_NODE)
            return fail(c, m, path, "expected a mapping {pci_bus_id, pci_device_id}");
        mock_nvswitch *sw = &out->nvswitch[out->nswitch];
        int have_bus = 0, have_id = 0;
        for (yaml_node_pair_t *p = m->data.mapping.pairs.start; p < m->data.mapping.pairs.top;
             p++) {
            const char *ks = scalar(yaml_document_get_node(&c->doc, p->key));
            yaml_node_t *val = yaml_document_get_node(&c->doc, p->value);
            char f[96];
            snprintf(f, sizeof f, "%s.%s", path, ks ? ks : "?");
            if (ks && !strcmp(ks, "pci_bus_id")) {
                if (get_bus_id(c, val, f, sw->pci_bus_id, &sw->domain, &sw->bus, &sw->device))
                    return -1;
                have_bus = 1;
            } else if (ks && !strcmp(ks, "pci_device_id")) {
                if (get_u32(c, val, f, 0xffffffffu, &sw->pci_device_id))
                    return -1;
                have_id = 1;
            } else if (ks && !strcmp(ks, "pci_subsystem_id")) {
                if (get_u32(c, val, f, 0xffffffffu, &sw->pci_subsystem_id))
                    return -1;
            } else {
                return fail(c, val, f,
                            "unknown field (NVSwitch fields: pci_bus_id, pci_device_id, "
                            "pci_subsystem_id)");
            }
        }
        if (!have_bus || !have_id)
            return fail(c, m, path, "needs both pci_bus_id and pci_device_id");
        out->nswitch++;
    }
    return 0;
}

static int parse_cuda_version(yctx *c, yaml_node_t *v, int *out)
{
    const char *s = scalar(v);
    unsigned a, b;
    char extra;
    if (s && sscanf(s, "%u.%u%c", &a, &b, &extra) == 2 && a < 100 && b < 100) {
        *out = (int)(a * 1000 + b * 10);
        return 0;
    }
    unsigned long long n;
    if (s && strchr(s, '.') == NULL && get_uint(c, v, "cuda_driver_version", 999999, &n) == 0) {
        *out = (int)n;
        return 0;
    }
    return fail(c, v, "cuda_driver_version", "expected \"12.4\" or 12040, got '%s'", s ? s : "");
}

static int validate(yctx *c, mock_profile *out, yaml_node_t *gpus_node,
                    yaml_node_t *switches_node)
{
    for (unsigned i = 0; i < out->ngpu; i++) {
        mock_gpu *g = &out->gpu[i];
        char path[32];
        snprintf(path, sizeof path, "gpus[%u]", i);
        for (unsigned j = 0; j < i; j++) {
            if (!strcmp(g->pci_bus_id, out->gpu[j].pci_bus_id))
                return fail(c, gpus_node, path, "pci_bus_id %s is also used by gpus[%u]",
                            g->pci_bus_id, j);
            if (!strcmp(g->uuid, out->gpu[j].uuid))
                return fail(c, gpus_node, path, "uuid %s is also used by gpus[%u]", g->uuid, j);
        }
        if (g->numa_node >= 0 && out->nnuma) {
            int found = 0;
            for (unsigned k = 0; k < out->nnuma; k++)
                found |= out->numa[k].id == g->numa_node;
            if (!found)
                return fail(c, gpus_node, path, "numa_node %d is not listed in numa_nodes",
                            g->numa_node);
        }
        if (g->mig_enabled && !g->mig)
            return fail(c, gpus_node, path, "mig_enabled needs a mig_table (the GPU is not MIG capable)");
        if (g->n_nvlink_peers && g->n_nvlink_switches)
            return fail(c, gpus_node, path,
                        "nvlink_peers and nvlink_switches are exclusive (a GPU's links go to GPUs "
                        "or to NVSwitches; set the other to [] to override defaults)");
        for (unsigned k = 0; k < g->n_nvlink_peers; k++) {
            int p = g->nvlink_peers[k];
            if (p == (int)i || (unsigned)p >= out->ngpu)
                return fail(c, gpus_node, path, "nvlink_peers: %d is not another GPU of this node",
                            p);
            int back = 0;
            for (unsigned m = 0; m < out->gpu[p].n_nvlink_peers; m++)
                back |= out->gpu[p].nvlink_peers[m] == (int)i;
            if (!back)
                return fail(c, gpus_node, path,
                            "nvlink_peers: GPU %d does not list %u back (NVLink is symmetric)", p, i);
        }
        if (g->n_nvlink_peers && !g->nvlink_links)
            return fail(c, gpus_node, path, "nvlink_peers needs nvlink_links > 0");
        if (g->n_nvlink_switches && !g->nvlink_links)
            return fail(c, gpus_node, path, "nvlink_switches needs nvlink_links > 0");
        for (unsigned k = 0; k < g->n_nvlink_switches; k++)
            if ((unsigned)g->nvlink_switches[k] >= out->nswitch)
                return fail(c, gpus_node, path,
                            "nvlink_switches: %d is not an NVSwitch of this node (nvswitches lists "
                            "%u)",
                            g->nvlink_switches[k], out->nswitch);
    }
    for (unsigned s = 0; s < out->nswitch; s++) {
        char path[32];
        snprintf(path, sizeof path, "nvswitches[%u]", s);
        const char *bus = out->nvswitch[s].pci_bus_id;
        for (unsigned j = 0; j < s; j++)
            if (!strcmp(bus, out->nvswitch[j].pci_bus_id))
                return fail(c, switches_node, path, "pci_bus_id %s is also used by nvswitches[%u]",
                            bus, j);
        for (unsigned j = 0; j < out->ngpu; j++)
            if (!strcmp(bus, out->gpu[j].pci_bus_id))
                return fail(c, switches_node, path, "pci_bus_id %s is also used by gpus[%u]", bus,
                            j);
    }
    return 0;
}

static int parse_root(yctx *c, yaml_node_t *root, mock_profile *out)
{
    if (!root)
        return fail(c, NULL, "(document)", "the profile is empty");
    if (root->type != YAML_MAPPING_NODE)
        return fail(c, root, "(top level)", "expected a mapping");
    mock_gpu defaults;
    memset(&defaults, 0, sizeof defaults);
    defaults.brand = NVML_BRAND_NVIDIA;
    defaults.numa_node = -1;
    defaults.pcie_switch = -1;
    defaults.persistence = 1;
    defaults.temperature_c = 35;
    defaults.pcie_gen = 4;
    defaults.pcie_width = 16;
    unsigned dseen = 0;
    yaml_node_t *gpus = NULL, *defaults_node = NULL, *switches_node = NULL;
    int have_driver = 0, have_cuda = 0, have_name = 0;
    char seed[128] = "";

    for (yaml_node_pair_t *p = root->data.mapping.pairs.start; p < root->data.mapping.pairs.top;
         p++) {
        yaml_node_t *k = yaml_document_get_node(&c->doc, p->key);
        yaml_node_t *v = yaml_document_get_node(&c->doc, p->value);
        const char *ks = scalar(k);
        if (!ks)
            return fail(c, k, "(top level)", "keys must be strings");
        if (!strcmp(ks, "name")) {
            if (get_str(c, v, "name", out->name, sizeof out->name))
                return -1;
            have_name = 1;
        } else if (!strcmp(ks, "description")) {
            if (!scalar(v))
                return fail(c, v, "description", "expected a string");
        } else if (!strcmp(ks, "machine")) { /* the DMI product name: the lab's sysfs, not NVML */
            if (!scalar(v))
                return fail(c, v, "machine", "expected a string");
        } else if (!strcmp(ks, "seed")) {
            if (get_str(c, v, "seed", seed, sizeof seed))
                return -1;
        } else if (!strcmp(ks, "driver_version")) {
            if (get_str(c, v, "driver_version", out->driver_version, sizeof out->driver_version))
                return -1;
            have_driver = 1;
        } else if (!strcmp(ks, "cuda_driver_version")) {
            if (parse_cuda_version(c, v, &out->cuda_version))
                return -1;
            have_cuda = 1;
        } else if (!strcmp(ks, "nvml_version")) {
            if (get_str(c, v, "nvml_version", out->nvml_version, sizeof out->nvml_version))
                return -1;
        } else if (!strcmp(ks, "numa_nodes")) {
            if (numa_nodes(c, v, out))
                return -1;
        } else if (!strcmp(ks, "nvswitches")) {
            switches_node = v;
            if (nvswitches(c, v, out))
                return -1;
        } else if (!strcmp(ks, "defaults")) {
            defaults_node = v;
        } else if (!strcmp(ks, "gpus")) {
            gpus = v;
        } else {
            return fail(c, k, ks,
                        "unknown field (top-level fields: name, description, machine, seed, "
                        "driver_version, cuda_driver_version, nvml_version, numa_nodes, nvswitches, "
                        "defaults, gpus)");
        }
    }
    if (!have_name)
        return fail(c, root, "name", "missing");
    if (!have_driver)
        return fail(c, root, "driver_version", "missing");
    if (!have_cuda)
        return fail(c, root, "cuda_driver_version", "missing");
    if (defaults_node && gpu_mapping(c, defaults_node, "defaults", &defaults, &dseen))
        return -1;
    if (!gpus)
        return fail(c, root, "gpus", "missing (a list of GPUs)");
    if (gpus->type != YAML_SEQUENCE_NODE)
        return fail(c, gpus, "gpus", "expected a list of GPUs");

    const char *env_seed = getenv("GPUKIT_NVML_SEED");
    if (env_seed && *env_seed)
        snprintf(out->seed, sizeof out->seed, "%s", env_seed);
    else
        snprintf(out->seed, sizeof out->seed, "%s", seed[0] ? seed : out->name);

    out->ngpu = 0;
    for (yaml_node_item_t *it = gpus->data.sequence.items.start; it < gpus->data.sequence.items.top;
         it++) {
        yaml_node_t *m = yaml_document_get_node(&c->doc, *it);
        unsigned i = out->ngpu;
        char path[32];
        snprintf(path, sizeof path, "gpus[%u]", i);
        if (i >= MOCK_MAX_GPUS)
            return fail(c, m, "gpus", "at most %d GPUs", MOCK_MAX_GPUS);
        mock_gpu *g = &out->gpu[i];
        *g = defaults;
        unsigned seen = dseen & ~(F_UUID | F_SERIAL | F_PCI_BUS_ID | F_MINOR);
        if (dseen & (F_UUID | F_SERIAL | F_PCI_BUS_ID | F_MINOR))
            return fail(c, defaults_node, "defaults",
                        "uuid, serial, pci_bus_id and minor_number are per GPU (put them in gpus[])");
        if (gpu_mapping(c, m, path, g, &seen))
            return -1;
        static const struct {
            unsigned bit;
            const char *name;
        } required[] = {{F_NAME, "name"},
                        {F_PCI_BUS_ID, "pci_bus_id"},
                        {F_PCI_DEVICE_ID, "pci_device_id"},
                        {F_MEMORY, "memory_mib"},
                        {F_CC, "compute_capability"},
                        {F_ARCH, "architecture"}};
        for (size_t r = 0; r < sizeof required / sizeof required[0]; r++)
            if (!(seen & required[r].bit)) {
                char f[64];
                snprintf(f, sizeof f, "%s.%s", path, required[r].name);
                return fail(c, m, f, "missing (set it in gpus[] or in defaults)");
            }
        char material[256];
        if (!(seen & F_UUID)) {
            snprintf(material, sizeof material, "%s/gpu/%u", out->seed, i);
            mock_uuid(g->uuid, sizeof g->uuid, "GPU-", material);
        }
        if (!(seen & F_SERIAL)) {
            snprintf(material, sizeof material, "%s/serial/%u", out->seed, i);
            uint64_t h = mix64(fnv1a(material, 0xcbf29ce484222325ULL));
            snprintf(g->serial, sizeof g->serial, "1%012llu",
                     (unsigned long long)(h % 1000000000000ULL));
        }
        if (!(seen & F_MINOR))
            g->minor = i;
        if (!g->multiprocessors && g->mig)
            g->multiprocessors = g->mig->multiprocessors;
        if (!g->power_limit_mw)
            g->power_limit_mw = 300000;
        if (!g->power_usage_mw)
            g->power_usage_mw = g->power_limit_mw / 6;
        if (!g->vbios[0])
            snprintf(g->vbios, sizeof g->vbios, "%s", "00.00.00.00.00");
        if (g->nvlink_links && !g->nvlink_version)
            g->nvlink_version = NVML_NVLINK_VERSION_3_0;
        out->ngpu++;
    }
    if (out->ngpu == 0)
        return fail(c, gpus, "gpus", "the list is empty (a node profile needs at least one GPU)");
    if (!out->nvml_version[0])
        snprintf(out->nvml_version, sizeof out->nvml_version, "%d.%.64s", out->cuda_version / 1000,
                 out->driver_version);
    return validate(c, out, gpus, switches_node);
}

nvmlReturn_t profile_load(const char *path, mock_profile *out)
{
    memset(out, 0, sizeof *out);
    snprintf(out->path, sizeof out->path, "%s", path);
    FILE *f = fopen(path, "rb");
    if (!f) {
        mock_report_error("%s: cannot open the GPU profile: %s (set GPUKIT_NVML_PROFILE to a "
                          "profile from gpukit/lab/profiles/)",
                          path, strerror(errno));
        return errno == EACCES ? NVML_ERROR_NO_PERMISSION : NVML_ERROR_DRIVER_NOT_LOADED;
    }
    yaml_parser_t parser;
    yctx c;
    memset(&c, 0, sizeof c);
    c.file = path;
    if (!yaml_parser_initialize(&parser)) {
        fclose(f);
        mock_report_error("%s: cannot initialise the YAML parser", path);
        return NVML_ERROR_MEMORY;
    }
    yaml_parser_set_input_file(&parser, f);
    if (!yaml_parser_load(&parser, &c.doc)) {
        mock_report_error("%s: not valid YAML: %s at line %lu, column %lu", path,
                          parser.problem ? parser.problem : "syntax error",
                          (unsigned long)parser.problem_mark.line + 1,
                          (unsigned long)parser.problem_mark.column + 1);
        yaml_parser_delete(&parser);
        fclose(f);
        return NVML_ERROR_UNKNOWN;
    }
    int r = parse_root(&c, yaml_document_get_root_node(&c.doc), out);
    yaml_document_delete(&c.doc);
    yaml_parser_delete(&parser);
    fclose(f);
    return r ? NVML_ERROR_UNKNOWN : NVML_SUCCESS;
}
