/*
 * fake_nvml.c: a stand-in libnvidia-ml.so.1 for tests on machines without a GPU.
 *
 * It exports exactly the NVML symbols the gpuhealth NVML collector calls through nvidia-ml-py
 * 13.615.71, with struct layouts matching pynvml's ctypes definitions, and serves the flat
 * scenario file named by $FAKE_NVML_SCENARIO, or /etc/fake-nvml/scenario.conf when that is
 * unset (a node reached over SSH, where no environment is passed on): one "key=value" per
 * line, '#' comments, a later line overriding an earlier one. Keys (defaults: a healthy H100
 * SXM on driver 570.86.15; build with -DFAKE_NVML_DRIVER_VERSION='"560.35.03"' and
 * -DFAKE_NVML_CUDA_VERSION=12060 for a library that is another driver release by default):
 *
 *   init                          the answer of nvmlInit (ok)
 *   driver_version                FAKE_NVML_DRIVER_VERSION (570.86.15)
 *   nvml_version                  "12." + driver_version
 *   cuda_driver_version           FAKE_NVML_CUDA_VERSION (12080 = 12.8)
 *   gpu.count                     8
 *   fn.<symbol>                   any call of that symbol, e.g. fn.nvmlDeviceGetTemperatureV=ERROR:13
 *                                 makes the library look older than that function
 *   gpu.<i>.<key>, gpu.all.<key>  one GPU, every GPU; <key> is one of
 *     handle (ok: the answer of nvmlDeviceGetHandleByIndex)
 *     device (ok: the answer of every call on the GPU's handle, e.g. ERROR:15 for a GPU that
 *       fell off the bus after NVML took its handle)
 *     name  uuid  serial  pci_bus_id  pci_device_id (0x233010DE)  architecture (9)
 *     vbios_version  persistence_mode (1)  memory.total_mib (81559)  memory.used_mib (0)
 *     memory.used_mib_after_s ("SECONDS:MIB": memory.used_mib becomes MIB that many seconds
 *       after the process's first nvmlInit, as when a finished job's memory is freed)
 *     temperature (40)  temp.slowdown (87)  temp.shutdown (92)  temp.gpu_max (85)
 *     temp.margin (temp.gpu_max - temperature)  ecc.mode (1)
 *     ecc.<volatile|aggregate>.<sram|dram>_<corrected|uncorrected> (0)
 *     ecc.<volatile|aggregate>.<corrected|uncorrected> (sum of the sram and dram parts)
 *     retired_pages.<single_bit|double_bit|pending> (NOT_SUPPORTED, as on Ampere and later)
 *     remapped_rows.<correctable|uncorrectable|pending|failure> (0)
 *     clocks_event_reasons (0x1 gpu_idle)  power.draw_w (120)  power.limit_w (700)
 *     pstate (0: P0, as an idle H100 in persistence mode; 8 = P8; 32 = unknown)
 *     utilization.<gpu|memory> (0 0, percent)
 *     pcie.<gen_current|gen_max|width_current|width_max|replay_count> (5 5 16 16 0)
 *     nvlink.count (18; 0 = PCIe-only board)  nvlink.<link> (1 = up)
 *     processes ("pid:used_mib,pid:used_mib", none)
 *     recovery_action (0; NOT_SUPPORTED when driver_version is older than r570, which added it)
 *     fabric.state (3 COMPLETED: 1 NOT_STARTED, 2 IN_PROGRESS, 0 = no NVLink fabric)
 *     fabric.status (0, the nvmlReturn_t of the GPU's fabric registration, e.g. 23)
 *     fabric.clique_id (0)  fabric.cluster_uuid (00000000-0000-0000-0000-000000000000)
 *     fabric.health_mask (0: no condition reported, as on Hopper; 0xaa: the four 2-bit
 *       conditions FALSE)  fabric.health_summary (0 NOT_SUPPORTED, 1 HEALTHY, 2 UNHEALTHY)
 *     nvlink_errors.<counter>, nvlink_errors.<link>.<counter> (0): nvmlDeviceGetNvLinkErrorCounter
 *       of every link, of one link; <counter> is replay, recovery, crc_flit, crc_data or
 *       ecc_data; "BASE+STEP" reads BASE, then BASE+STEP, BASE+2*STEP... at each later read of
 *       that GPU, link and counter in the process (a counter that grows while it is watched)
 *     nvlink_count.<counter>, nvlink_count.<link>.<counter>: the NVLink5 error counters that
 *       nvmlDeviceGetFieldValues serves per link (scopeId = link), "BASE+STEP" as above, counted
 *       per GPU, link and field; <counter> is malformed_packet (field 206), buffer_overrun
 *       (207), rcv (208), rcv_remote (209), rcv_general (210), local_link_integrity (211),
 *       recovery_successful (213), recovery_failed (214), link_recovery (215), effective (219)
 *       or symbol (221). Default 0 when architecture is 10 (Blackwell) or later, else
 *       NOT_SUPPORTED (NVLink5 only); a link at or past nvlink.count is INVALID_ARGUMENT
 *     module_id (NOT_SUPPORTED): nvmlDeviceGetModuleId
 *     platform.<chassis_serial|slot_number|tray_index|host_id|peer_type|module_id> ("" 0 0 0 0
 *       0; peer_type's values are not published, nvidia-smi prints words): what
 *       nvmlDeviceGetPlatformInfo reports when platform_info_version allows it
 *   fabric_info_version           3: the newest nvmlGpuFabricInfo struct the driver takes in
 *                                 nvmlDeviceGetGpuFabricInfoV (2: a driver without the summary)
 *   platform_info_version         0: nvmlDeviceGetPlatformInfo is NOT_SUPPORTED (HGX boards);
 *                                 2: the driver takes v2 and v1; 1: v1 only (an older driver)
 *   calls.<symbol>                a file this library appends one line to at each call of
 *                                 that symbol, the GPU's index, so tests count calls per GPU
 *                                 (nvmlDeviceGetFieldValues, nvmlDeviceGetNvLinkErrorCounter)
 *
 * Any value may instead be NOT_SUPPORTED (the call returns NVML_ERROR_NOT_SUPPORTED),
 * ERROR:<code> (that nvmlReturn_t) or HANG (the call never returns). Without a readable
 * scenario file nvmlInit fails with NVML_ERROR_DRIVER_NOT_LOADED, as on a node with no driver.
 * Other keys are ignored: on the test bed the same file carries dcgm.*, nccl.* and gpud.* for
 * the replaying tools (selftest/testbed/README.md, "Scenario keys").
 */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef int nvmlReturn_t;
enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3,
    NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_DRIVER_NOT_LOADED = 9,
    NVML_ERROR_GPU_IS_LOST = 15,
    NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25,
    NVML_ERROR_UNKNOWN = 999,
};

#ifndef FAKE_NVML_DEFAULT_SCENARIO
#define FAKE_NVML_DEFAULT_SCENARIO "/etc/fake-nvml/scenario.conf"
#endif
#ifndef FAKE_NVML_DRIVER_VERSION
#define FAKE_NVML_DRIVER_VERSION "570.86.15"
#endif
#ifndef FAKE_NVML_CUDA_VERSION
#define FAKE_NVML_CUDA_VERSION 12080
#endif
#define RECOVERY_ACTION_MIN_BRANCH 570 /* first driver branch with field 230 */

#define MAX_GPUS 64
#define MAX_ENTRIES 4096
#define FIELD_GPU_RECOVERY_ACTION 230
#define TEMPERATURE_V1 0x100000C   /* nvmlTemperature_v1: sizeof 12, version 1 */
#define MARGIN_TEMPERATURE_V1 0x1000008
#define LOCATION_DRAM 2
#define LOCATION_SRAM 7
#define GPU_FABRIC_INFO_V2 0x2000024 /* nvmlGpuFabricInfo_v2: sizeof 36, version 2 */
#define GPU_FABRIC_INFO_V3 0x3000028 /* nvmlGpuFabricInfo_v3: sizeof 40, version 3 */
#define GPU_FABRIC_UUID_LEN 16
#define PLATFORM_INFO_V1 0x100002C /* nvmlPlatformInfo_v1: sizeof 44, version 1 */
#define PLATFORM_INFO_V2 0x200002C
#define MAX_NVLINKS 36            /* NVML_NVLINK_MAX_LINKS */
#define NVLINK_ERROR_COUNTERS 5   /* NVML_NVLINK_ERROR_COUNT */
#define NVLINK_FIELD_COUNTERS 11  /* the NVLink5 counters served as field values */

/* Layouts as in pynvml 13.615.71 (nvmlPciInfo_t, c_nvmlMemory_t, c_nvmlFieldValue_t, ...). */
typedef struct fake_device { int index; } *nvmlDevice_t;
typedef struct {
    char busIdLegacy[16];
    unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
    char busId[32];
} nvmlPciInfo_t;
typedef struct { unsigned long long total, free, used; } nvmlMemory_t;
typedef struct { unsigned int gpu, memory; } nvmlUtilization_t;
typedef struct { unsigned int version, sensorType; int temperature; } nvmlTemperature_t;
typedef struct { unsigned int version; int marginTemperature; } nvmlMarginTemperature_t;
typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId, computeInstanceId;
} nvmlProcessInfo_t;
typedef struct { /* nvmlDeviceGetGpuFabricInfo's (c_nvmlGpuFabricInfo_t) */
    unsigned char clusterUuid[GPU_FABRIC_UUID_LEN];
    nvmlReturn_t status;
    unsigned int cliqueId, state;
} nvmlGpuFabricInfo_t;
typedef struct { /* c_nvmlGpuFabricInfo_v3_t; v2 ends before healthSummary */
    unsigned int version;
    unsigned char clusterUuid[GPU_FABRIC_UUID_LEN];
    nvmlReturn_t status;
    unsigned int cliqueId, state, healthMask;
    unsigned char healthSummary;
} nvmlGpuFabricInfoV_t;
typedef struct { /* c_nvmlPlatformInfo_v2_t; v1 has the same layout (rackGuid, chassis-
                   physical slot, compute slot index, node index in place of v2's fields) */
    unsigned int version;
    unsigned char ibGuid[16], chassisSerialNumber[16];
    unsigned char slotNumber, trayIndex, hostId, peerType, moduleId;
} nvmlPlatformInfo_t;
_Static_assert(sizeof(nvmlPlatformInfo_t) == (PLATFORM_INFO_V2 & 0xffff), "platform layout");
_Static_assert(sizeof(nvmlGpuFabricInfo_t) == 28, "c_nvmlGpuFabricInfo_t layout");
_Static_assert(sizeof(nvmlGpuFabricInfoV_t) == (GPU_FABRIC_INFO_V3 & 0xffff), "v3 layout");
typedef union {
    double dVal;
    unsigned int uiVal;
    unsigned long ulVal;
    unsigned long long ullVal;
    long long sllVal;
    int siVal;
    unsigned short usVal;
} nvmlValue_t;
typedef struct {
    unsigned int fieldId, scopeId;
    long long timestamp, latencyUsec;
    unsigned int valueType;
    nvmlReturn_t nvmlReturn;
    nvmlValue_t value;
} nvmlFieldValue_t;

static struct fake_device devices[MAX_GPUS];
static char *keys[MAX_ENTRIES], *values[MAX_ENTRIES];
static int n_entries, init_count;
static struct timespec first_init; /* scenario times count from the first nvmlInit */
/* How often each NVLink error counter was read, for "BASE+STEP" counters that grow. */
static unsigned long long nvlink_error_reads[MAX_GPUS][MAX_NVLINKS][NVLINK_ERROR_COUNTERS];
static unsigned long long nvlink_field_reads[MAX_GPUS][MAX_NVLINKS][NVLINK_FIELD_COUNTERS];
/* The bus ids of the real 8x H100 nvidia-smi sample (selftest/data/nvidia-smi), so fake GPUs
   join with the sample-based fixture trees of selftest/data/system. */
static const unsigned int hgx_buses[8] = {0x19, 0x3b, 0x4c, 0x5d, 0x9b, 0xbb, 0xcb, 0xdb};

#define TRY(expr) do { nvmlReturn_t rc_ = (expr); if (rc_) return rc_; } while (0)
/* Every entry point: NVML initialised, then the scenario's fn.<symbol> override. */
#define ENTER() TRY(enter(__func__))
/* ... and for a device, its gpu.<i>.device answer (a GPU lost after its handle was taken). */
#define ENTER_DEVICE(dev) \
    do { \
        ENTER(); \
        if (!valid(dev)) \
            return NVML_ERROR_INVALID_ARGUMENT; \
        TRY(special(gpu_value((dev)->index, "device"))); \
    } while (0)

static char *trim(char *s)
{
    char *end;
    while (isspace((unsigned char)*s))
        s++;
    end = s + strlen(s);
    while (end > s && isspace((unsigned char)end[-1]))
        *--end = '\0';
    return s;
}

/* Read the scenario file; 0 when there is none (the "driver not loaded" node). */
static int load_scenario(void)
{
    const char *path = getenv("FAKE_NVML_SCENARIO");
    FILE *file = fopen(path ? path : FAKE_NVML_DEFAULT_SCENARIO, "r");
    char line[1024];

    if (!file)
        return 0;
    while (n_entries > 0) {
        n_entries--;
        free(keys[n_entries]);
        free(values[n_entries]);
    }
    while (fgets(line, sizeof line, file) && n_entries < MAX_ENTRIES) {
        char *key = trim(line), *eq = strchr(key, '=');
        if (*key == '#' || !eq)
            continue;
        *eq = '\0';
        keys[n_entries] = strdup(trim(key));
        values[n_entries] = strdup(trim(eq + 1));
        n_entries++;
    }
    fclose(file);
    return 1;
}

static const char *lookup(const char *key)
{
    for (int i = n_entries - 1; i >= 0; i--)
        if (!strcmp(keys[i], key))
            return values[i];
    return NULL;
}

static const char *gpu_value(int gpu, const char *key)
{
    char full[256];
    const char *value;

    snprintf(full, sizeof full, "gpu.%d.%s", gpu, key);
    if ((value = lookup(full)))
        return value;
    snprintf(full, sizeof full, "gpu.all.%s", key);
    return lookup(full);
}

/* NVML_SUCCESS for an ordinary value, else the error the value asks for; HANG never returns. */
static nvmlReturn_t special(const char *value)
{
    if (!value)
        return NVML_SUCCESS;
    if (!strcmp(value, "NOT_SUPPORTED"))
        return NVML_ERROR_NOT_SUPPORTED;
    if (!strncmp(value, "ERROR:", 6))
        return atoi(value + 6) ? atoi(value + 6) : NVML_ERROR_UNKNOWN;
    if (!strcmp(value, "HANG"))
        for (;;)
            sleep(3600);
    return NVML_SUCCESS;
}

/* A number used to compute another key's default; NOT_SUPPORTED and the like count as 0. */
static double plain(const char *value, double fallback)
{
    if (!value)
        return fallback;
    return isdigit((unsigned char)*value) || *value == '-' ? strtod(value, NULL) : 0;
}

static nvmlReturn_t enter(const char *symbol)
{
    char key[128];

    if (!init_count)
        return NVML_ERROR_UNINITIALIZED;
    snprintf(key, sizeof key, "fn.%s", symbol);
    return special(lookup(key));
}

static int valid(nvmlDevice_t dev)
{
    return dev && dev >= devices && dev < devices + MAX_GPUS;
}

static nvmlReturn_t copy_str(const char *value, char *buf, unsigned int length)
{
    size_t size = strlen(value) + 1;

    if (!buf || size > length)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(buf, value, size);
    return NVML_SUCCESS;
}

/* A scenario value (or its default) that may instead ask for an error. */
static nvmlReturn_t sys_str(const char *key, const char *fallback, char *buf, unsigned int length)
{
    const char *value = lookup(key);

    TRY(special(value));
    return copy_str(value ? value : fallback, buf, length);
}

static nvmlReturn_t gpu_str(int gpu, const char *key, const char *fallback, char *buf,
                            unsigned int length)
{
    const char *value = gpu_value(gpu, key);

    TRY(special(value));
    return copy_str(value ? value : fallback, buf, length);
}

static nvmlReturn_t gpu_num(int gpu, const char *key, const char *fallback, double *out)
{
    const char *value = gpu_value(gpu, key);

    if (!value)
        value = fallback;
    TRY(special(value));
    *out = strtod(value, NULL);
    return NVML_SUCCESS;
}

/* gpu_num into an unsigned int, the type of most NVML outputs. */
static nvmlReturn_t gpu_uint(int gpu, const char *key, const char *fallback, unsigned int *out)
{
    double value;

    if (!out)
        return NVML_ERROR_INVALID_ARGUMENT;
    TRY(gpu_num(gpu, key, fallback, &value));
    *out = (unsigned int)value;
    return NVML_SUCCESS;
}

static int gpu_count(void)
{
    int count = (int)plain(lookup("gpu.count"), 8);

    return count < 0 ? 0 : count > MAX_GPUS ? MAX_GPUS : count;
}

/* ---- system ---------------------------------------------------------------------------- */

nvmlReturn_t nvmlInitWithFlags(unsigned int flags)
{
    (void)flags;
    if (!load_scenario())
        return NVML_ERROR_DRIVER_NOT_LOADED;
    TRY(special(lookup("init")));
    for (int i = 0; i < MAX_GPUS; i++)
        devices[i].index = i;
    if (!first_init.tv_sec && !first_init.tv_nsec)
        clock_gettime(CLOCK_MONOTONIC, &first_init);
    init_count++;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlShutdown(void)
{
    ENTER();
    init_count--;
    return NVML_SUCCESS;
}

/* pynvml asks only for codes it has no text of its own for. */
const char *nvmlErrorString(nvmlReturn_t result)
{
    switch (result) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
    case 26: return "Deprecated";
    default: return "Unknown Error";
    }
}

nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length)
{
    ENTER();
    return sys_str("driver_version", FAKE_NVML_DRIVER_VERSION, version, length);
}

nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length)
{
    char fallback[96];
    const char *driver = lookup("driver_version");

    ENTER();
    snprintf(fallback, sizeof fallback, "12.%s",
             driver && isdigit((unsigned char)*driver) ? driver : FAKE_NVML_DRIVER_VERSION);
    return sys_str("nvml_version", fallback, version, length);
}

nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *version)
{
    const char *value = lookup("cuda_driver_version");

    ENTER();
    TRY(special(value));
    *version = value ? atoi(value) : FAKE_NVML_CUDA_VERSION;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count)
{
    ENTER();
    TRY(special(lookup("gpu.count")));
    *count = (unsigned int)gpu_count();
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *dev)
{
    ENTER();
    if (index >= (unsigned int)gpu_count())
        return NVML_ERROR_INVALID_ARGUMENT;
    TRY(special(gpu_value((int)index, "handle")));
    *dev = &devices[index];
    return NVML_SUCCESS;
}

/* ---- identity -------------------------------------------------------------------------- */

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t dev, char *name, unsigned int length)
{
    ENTER_DEVICE(dev);
    return gpu_str(dev->index, "name", "NVIDIA H100 80GB HBM3", name, length);
}

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t dev, char *uuid, unsigned int length)
{
    char fallback[64];

    ENTER_DEVICE(dev);
    snprintf(fallback, sizeof fallback, "GPU-fa4e%04x-0000-4000-8000-%012x", dev->index,
             dev->index);
    return gpu_str(dev->index, "uuid", fallback, uuid, length);
}

nvmlReturn_t nvmlDeviceGetSerial(nvmlDevice_t dev, char *serial, unsigned int length)
{
    char fallback[32];

    ENTER_DEVICE(dev);
    snprintf(fallback, sizeof fallback, "16501240315%02d", dev->index);
    return gpu_str(dev->index, "serial", fallback, serial, length);
}

nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t dev, nvmlPciInfo_t *pci)
{
    char fallback[32];
    int index;
    double device_id;

    ENTER_DEVICE(dev);
    index = dev->index;
    snprintf(fallback, sizeof fallback, "00000000:%02X:00.0",
             index < 8 ? hgx_buses[index] : 0x10u + index);
    memset(pci, 0, sizeof *pci);
    TRY(gpu_str(index, "pci_bus_id", fallback, pci->busId, sizeof pci->busId));
    TRY(gpu_num(index, "pci_device_id", "0x233010DE", &device_id));
    sscanf(pci->busId, "%x:%x:%x", &pci->domain, &pci->bus, &pci->device);
    snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, "%04X:%02X:%02X.0",
             pci->domain & 0xffff, pci->bus & 0xff, pci->device & 0xff);
    pci->pciDeviceId = (unsigned int)device_id;
    pci->pciSubSystemId = 0x16C110DE;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetArchitecture(nvmlDevice_t dev, unsigned int *arch)
{
    ENTER_DEVICE(dev);
    return gpu_uint(dev->index, "architecture", "9", arch);
}

nvmlReturn_t nvmlDeviceGetVbiosVersion(nvmlDevice_t dev, char *version, unsigned int length)
{
    ENTER_DEVICE(dev);
    return gpu_str(dev->index, "vbios_version", "96.00.74.00.0D", version, length);
}

nvmlReturn_t nvmlDeviceGetPersistenceMode(nvmlDevice_t dev, unsigned int *mode)
{
    ENTER_DEVICE(dev);
    return gpu_uint(dev->index, "persistence_mode", "1", mode);
}

static double seconds_since_first_init(void)
{
    struct timespec now;

    clock_gettime(CLOCK_MONOTONIC, &now);
    return (double)(now.tv_sec - first_init.tv_sec) + (now.tv_nsec - first_init.tv_nsec) / 1e9;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t dev, nvmlMemory_t *memory)
{
    const char *after, *colon;
    double total, used;

    ENTER_DEVICE(dev);
    TRY(gpu_num(dev->index, "memory.total_mib", "81559", &total));
    TRY(gpu_num(dev->index, "memory.used_mib", "0", &used));
    after = gpu_value(dev->index, "memory.used_mib_after_s");
    colon = after ? strchr(after, ':') : NULL;
    if (colon && seconds_since_first_init() >= strtod(after, NULL))
        used = strtod(colon + 1, NULL);
    memory->total = (unsigned long long)total << 20;
    memory->used = (unsigned long long)used << 20;
    memory->free = memory->total - memory->used;
    return NVML_SUCCESS;
}

/* ---- temperatures ---------------------------------------------------------------------- */

nvmlReturn_t nvmlDeviceGetTemperatureV(nvmlDevice_t dev, nvmlTemperature_t *temperature)
{
    double value;

    ENTER_DEVICE(dev);
    if (temperature->version != TEMPERATURE_V1)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    if (temperature->sensorType != 0)
        return NVML_ERROR_NOT_SUPPORTED;
    TRY(gpu_num(dev->index, "temperature", "40", &value));
    temperature->temperature = (int)value;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t dev, unsigned int sensor, unsigned int *temp)
{
    ENTER_DEVICE(dev);
    if (sensor != 0)
        return NVML_ERROR_NOT_SUPPORTED;
    return gpu_uint(dev->index, "temperature", "40", temp);
}

nvmlReturn_t nvmlDeviceGetTemperatureThreshold(nvmlDevice_t dev, unsigned int type,
                                               unsigned int *temp)
{
    static const char *const names[] = {"temp.shutdown", "temp.slowdown", NULL, "temp.gpu_max"};
    static const char *const fallbacks[] = {"92", "87", NULL, "85"};

    ENTER_DEVICE(dev);
    if (type > 3 || !names[type])
        return NVML_ERROR_NOT_SUPPORTED;
    return gpu_uint(dev->index, names[type], fallbacks[type], temp);
}

nvmlReturn_t nvmlDeviceGetMarginTemperature(nvmlDevice_t dev, nvmlMarginTemperature_t *margin)
{
    char fallback[32];
    double value;
    int index;

    ENTER_DEVICE(dev);
    if (margin->version != MARGIN_TEMPERATURE_V1)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    index = dev->index;
    snprintf(fallback, sizeof fallback, "%g", plain(gpu_value(index, "temp.gpu_max"), 85) -
             plain(gpu_value(index, "temperature"), 40));
    TRY(gpu_num(index, "temp.margin", fallback, &value));
    margin->marginTemperature = (int)value;
    return NVML_SUCCESS;
}

/* ---- ECC, retired pages, remapped rows ------------------------------------------------- */

nvmlReturn_t nvmlDeviceGetEccMode(nvmlDevice_t dev, unsigned int *current, unsigned int *pending)
{
    ENTER_DEVICE(dev);
    TRY(gpu_uint(dev->index, "ecc.mode", "1", current));
    *pending = *current;
    return NVML_SUCCESS;
}

static const char *const error_types[] = {"corrected", "uncorrected"};
static const char *const counter_types[] = {"volatile", "aggregate"};

nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t dev, unsigned int error_type,
                                         unsigned int counter_type, unsigned long long *count)
{
    char key[64], fallback[32];
    double sum = 0, value;

    ENTER_DEVICE(dev);
    if (error_type > 1 || counter_type > 1)
        return NVML_ERROR_INVALID_ARGUMENT;
    for (int part = 0; part < 2; part++) {
        snprintf(key, sizeof key, "ecc.%s.%s_%s", counter_types[counter_type],
                 part ? "dram" : "sram", error_types[error_type]);
        sum += plain(gpu_value(dev->index, key), 0);
    }
    snprintf(fallback, sizeof fallback, "%.0f", sum);
    snprintf(key, sizeof key, "ecc.%s.%s", counter_types[counter_type], error_types[error_type]);
    TRY(gpu_num(dev->index, key, fallback, &value));
    *count = (unsigned long long)value;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMemoryErrorCounter(nvmlDevice_t dev, unsigned int error_type,
                                             unsigned int counter_type, unsigned int location,
                                             unsigned long long *count)
{
    char key[64];
    double value;

    ENTER_DEVICE(dev);
    if (error_type > 1 || counter_type > 1)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (location != LOCATION_SRAM && location != LOCATION_DRAM)
        return NVML_ERROR_NOT_SUPPORTED;
    snprintf(key, sizeof key, "ecc.%s.%s_%s", counter_types[counter_type],
             location == LOCATION_SRAM ? "sram" : "dram", error_types[error_type]);
    TRY(gpu_num(dev->index, key, "0", &value));
    *count = (unsigned long long)value;
    return NVML_SUCCESS;
}

/* Two-call protocol: a short buffer gets NVML_ERROR_INSUFFICIENT_SIZE and the needed count. */
nvmlReturn_t nvmlDeviceGetRetiredPages(nvmlDevice_t dev, unsigned int cause, unsigned int *count,
                                       unsigned long long *addresses)
{
    unsigned int pages;

    ENTER_DEVICE(dev);
    if (cause > 1)
        return NVML_ERROR_INVALID_ARGUMENT;
    TRY(gpu_uint(dev->index, cause ? "retired_pages.double_bit" : "retired_pages.single_bit",
                 "NOT_SUPPORTED", &pages));
    if (!addresses || *count < pages) {
        *count = pages;
        return pages ? NVML_ERROR_INSUFFICIENT_SIZE : NVML_SUCCESS;
    }
    for (unsigned int i = 0; i < pages; i++)
        addresses[i] = 0x100000ULL * (i + 1) + cause;
    *count = pages;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetRetiredPagesPendingStatus(nvmlDevice_t dev, unsigned int *pending)
{
    ENTER_DEVICE(dev);
    return gpu_uint(dev->index, "retired_pages.pending", "NOT_SUPPORTED", pending);
}

nvmlReturn_t nvmlDeviceGetRemappedRows(nvmlDevice_t dev, unsigned int *correctable,
                                       unsigned int *uncorrectable, unsigned int *pending,
                                       unsigned int *failure)
{
    ENTER_DEVICE(dev);
    TRY(gpu_uint(dev->index, "remapped_rows.correctable", "0", correctable));
    TRY(gpu_uint(dev->index, "remapped_rows.uncorrectable", "0", uncorrectable));
    TRY(gpu_uint(dev->index, "remapped_rows.pending", "0", pending));
    return gpu_uint(dev->index, "remapped_rows.failure", "0", failure);
}

/* ---- clocks, power, PCIe, NVLink ------------------------------------------------------- */

nvmlReturn_t nvmlDeviceGetCurrentClocksEventReasons(nvmlDevice_t dev, unsigned long long *reasons)
{
    double value;

    ENTER_DEVICE(dev);
    TRY(gpu_num(dev->index, "clocks_event_reasons", "1", &value));
    *reasons = (unsigned long long)value;
    return NVML_SUCCESS;
}

static nvmlReturn_t milliwatts(int gpu, const char *key, const char *watts, unsigned int *out)
{
    double value;

    TRY(gpu_num(gpu, key, watts, &value));
    *out = (unsigned int)(value * 1000 + 0.5);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t dev, unsigned int *power)
{
    ENTER_DEVICE(dev);
    return milliwatts(dev->index, "power.draw_w", "120", power);
}

nvmlReturn_t nvmlDeviceGetEnforcedPowerLimit(nvmlDevice_t dev, unsigned int *limit)
{
    ENTER_DEVICE(dev);
    return milliwatts(dev->index, "power.limit_w", "700", limit);
}

nvmlReturn_t nvmlDeviceGetPerformanceState(nvmlDevice_t dev, int *pstate)
{
    unsigned int value;

    ENTER_DEVICE(dev);
    if (!pstate)
        return NVML_ERROR_INVALID_ARGUMENT;
    TRY(gpu_uint(dev->index, "pstate", "0", &value));
    *pstate = (int)value;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t dev, nvmlUtilization_t *rates)
{
    ENTER_DEVICE(dev);
    if (!rates)
        return NVML_ERROR_INVALID_ARGUMENT;
    TRY(gpu_uint(dev->index, "utilization.gpu", "0", &rates->gpu));
    return gpu_uint(dev->index, "utilization.memory", "0", &rates->memory);
}

nvmlReturn_t nvmlDeviceGetCurrPcieLinkGeneration(nvmlDevice_t dev, unsigned int *gen)
{
    ENTER_DEVICE(dev);
    return gpu_uint(dev->index, "pcie.gen_current", "5", gen);
}

nvmlReturn_t nvmlDeviceGetMaxPcieLinkGeneration(nvmlDevice_t dev, unsigned int *gen)
{
    ENTER_DEVICE(dev);
    return gpu_uint(dev->index, "pcie.gen_max", "5", gen);
}

nvmlReturn_t nvmlDeviceGetCurrPcieLinkWidth(nvmlDevice_t dev, unsigned int *width)
{
    ENTER_DEVICE(dev);
    return gpu_uint(dev->index, "pcie.width_current", "16", width);
}

nvmlReturn_t nvmlDeviceGetMaxPcieLinkWidth(nvmlDevice_t dev, unsigned int *width)
{
    ENTER_DEVICE(dev);
    return gpu_uint(dev->index, "pcie.width_max", "16", width);
}

nvmlReturn_t nvmlDeviceGetPcieReplayCounter(nvmlDevice_t dev, unsigned int *count)
{
    ENTER_DEVICE(dev);
    return gpu_uint(dev->index, "pcie.replay_count", "0", count);
}

nvmlReturn_t nvmlDeviceGetNvLinkState(nvmlDevice_t dev, unsigned int link, unsigned int *active)
{
    unsigned int links;
    char key[32];

    ENTER_DEVICE(dev);
    TRY(gpu_uint(dev->index, "nvlink.count", "18", &links));
    if (links == 0)
        return NVML_ERROR_NOT_SUPPORTED;
    if (link >= links)
        return NVML_ERROR_INVALID_ARGUMENT;
    snprintf(key, sizeof key, "nvlink.%u", link);
    return gpu_uint(dev->index, key, "1", active);
}

/* calls.<symbol>: append the GPU's index to that file, one line per call. */
static void count_call(const char *symbol, int gpu)
{
    char key[128];
    const char *path;
    FILE *file;

    snprintf(key, sizeof key, "calls.%s", symbol);
    if (!(path = lookup(key)) || !(file = fopen(path, "a")))
        return;
    fprintf(file, "%d\n", gpu);
    fclose(file);
}

/* An NVLink counter of one GPU and link: <group>.<link>.<name>, else <group>.<name>, else
   `fallback`; "BASE+STEP" grows by STEP at each later read (*reads counts them). */
static nvmlReturn_t growing(int gpu, const char *group, unsigned int link, const char *name,
                            const char *fallback, unsigned long long *reads,
                            unsigned long long *value)
{
    unsigned long long base, step;
    const char *text;
    char key[96], *plus;

    snprintf(key, sizeof key, "%s.%u.%s", group, link, name);
    if (!(text = gpu_value(gpu, key))) {
        snprintf(key, sizeof key, "%s.%s", group, name);
        text = gpu_value(gpu, key);
    }
    if (!text)
        text = fallback;
    TRY(special(text));
    base = strtoull(text, &plus, 10);
    step = *plus == '+' ? strtoull(plus + 1, NULL, 10) : 0;
    *value = base + step * (*reads)++;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetNvLinkErrorCounter(nvmlDevice_t dev, unsigned int link,
                                             unsigned int counter, unsigned long long *value)
{
    static const char *const names[NVLINK_ERROR_COUNTERS] = {"replay", "recovery", "crc_flit",
                                                             "crc_data", "ecc_data"};
    unsigned int links;

    ENTER_DEVICE(dev);
    count_call(__func__, dev->index);
    if (!value || counter >= NVLINK_ERROR_COUNTERS)
        return NVML_ERROR_INVALID_ARGUMENT;
    TRY(gpu_uint(dev->index, "nvlink.count", "18", &links));
    if (links == 0)
        return NVML_ERROR_NOT_SUPPORTED;
    if (link >= links || link >= MAX_NVLINKS)
        return NVML_ERROR_INVALID_ARGUMENT;
    return growing(dev->index, "nvlink_errors", link, names[counter], "0",
                   &nvlink_error_reads[dev->index][link][counter], value);
}

/* ---- where the GPU sits ---------------------------------------------------------------- */

nvmlReturn_t nvmlDeviceGetModuleId(nvmlDevice_t dev, unsigned int *id)
{
    ENTER_DEVICE(dev);
    return gpu_uint(dev->index, "module_id", "NOT_SUPPORTED", id);
}

static nvmlReturn_t platform_byte(int gpu, const char *key, unsigned char *out)
{
    unsigned int value;
    char full[64];

    snprintf(full, sizeof full, "platform.%s", key);
    TRY(gpu_uint(gpu, full, "0", &value));
    *out = (unsigned char)value;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetPlatformInfo(nvmlDevice_t dev, nvmlPlatformInfo_t *info)
{
    unsigned int newest;
    char serial[64];

    ENTER_DEVICE(dev);
    if (!info)
        return NVML_ERROR_INVALID_ARGUMENT;
    newest = (unsigned int)plain(lookup("platform_info_version"), 0);
    if (newest == 0)
        return NVML_ERROR_NOT_SUPPORTED;
    if (!(info->version == PLATFORM_INFO_V2 && newest >= 2) &&
        !(info->version == PLATFORM_INFO_V1 && newest >= 1))
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    memset(info->ibGuid, 0, sizeof info->ibGuid);
    memset(info->chassisSerialNumber, 0, sizeof info->chassisSerialNumber);
    TRY(gpu_str(dev->index, "platform.chassis_serial", "", serial, sizeof serial));
    if (info->version == PLATFORM_INFO_V2) /* v1's field here is the rack GUID: left zero */
        memcpy(info->chassisSerialNumber, serial, strlen(serial) < 13 ? strlen(serial) : 13);
    TRY(platform_byte(dev->index, "slot_number", &info->slotNumber));
    TRY(platform_byte(dev->index, "tray_index", &info->trayIndex));
    TRY(platform_byte(dev->index, "host_id", &info->hostId));
    TRY(platform_byte(dev->index, "peer_type", &info->peerType));
    return platform_byte(dev->index, "module_id", &info->moduleId);
}

/* ---- NVLink fabric --------------------------------------------------------------------- */

/* What both fabric calls report: registration state and status, clique, cluster UUID. */
static nvmlReturn_t fabric_common(int gpu, unsigned char *uuid, nvmlReturn_t *status,
                                  unsigned int *clique, unsigned int *state)
{
    char text[64];
    const char *digit = text;
    unsigned int code;

    TRY(gpu_uint(gpu, "fabric.state", "3", state));
    TRY(gpu_uint(gpu, "fabric.status", "0", &code));
    *status = (nvmlReturn_t)code;
    TRY(gpu_uint(gpu, "fabric.clique_id", "0", clique));
    TRY(gpu_str(gpu, "fabric.cluster_uuid", "00000000-0000-0000-0000-000000000000", text,
                sizeof text));
    for (int i = 0; i < GPU_FABRIC_UUID_LEN; i++) { /* 32 hex digits, dashes anywhere */
        unsigned int byte;
        while (*digit == '-')
            digit++;
        if (!isxdigit((unsigned char)digit[0]) || !isxdigit((unsigned char)digit[1]) ||
            sscanf(digit, "%2x", &byte) != 1)
            return NVML_ERROR_UNKNOWN;
        uuid[i] = (unsigned char)byte;
        digit += 2;
    }
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetGpuFabricInfoV(nvmlDevice_t dev, nvmlGpuFabricInfoV_t *info)
{
    unsigned int newest, summary;

    ENTER_DEVICE(dev);
    if (!info)
        return NVML_ERROR_INVALID_ARGUMENT;
    newest = (unsigned int)plain(lookup("fabric_info_version"), 3);
    if (!(info->version == GPU_FABRIC_INFO_V3 && newest >= 3) &&
        !(info->version == GPU_FABRIC_INFO_V2 && newest >= 2))
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    TRY(fabric_common(dev->index, info->clusterUuid, &info->status, &info->cliqueId,
                      &info->state));
    TRY(gpu_uint(dev->index, "fabric.health_mask", "0", &info->healthMask));
    if (info->version == GPU_FABRIC_INFO_V3) { /* a v2 caller's struct ends before it */
        TRY(gpu_uint(dev->index, "fabric.health_summary", "0", &summary));
        info->healthSummary = (unsigned char)summary;
    }
    return NVML_SUCCESS;
}

/* Deprecated (no health), still the only fabric call of drivers older than the V call. */
nvmlReturn_t nvmlDeviceGetGpuFabricInfo(nvmlDevice_t dev, nvmlGpuFabricInfo_t *info)
{
    ENTER_DEVICE(dev);
    if (!info)
        return NVML_ERROR_INVALID_ARGUMENT;
    return fabric_common(dev->index, info->clusterUuid, &info->status, &info->cliqueId,
                         &info->state);
}

/* ---- processes, field values ----------------------------------------------------------- */

nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t dev, unsigned int *count,
                                                     nvmlProcessInfo_t *infos)
{
    char list[1024], *item, *rest;
    unsigned int found = 0;

    ENTER_DEVICE(dev);
    TRY(gpu_str(dev->index, "processes", "", list, sizeof list));
    for (item = strtok_r(list, ",", &rest); item; item = strtok_r(NULL, ",", &rest)) {
        if (infos && found < *count) {
            const char *colon = strchr(item, ':');
            infos[found].pid = (unsigned int)strtoul(item, NULL, 10);
            infos[found].usedGpuMemory = colon ? strtoull(colon + 1, NULL, 10) << 20 : 0;
            infos[found].gpuInstanceId = infos[found].computeInstanceId = 0xFFFFFFFF;
        }
        found++;
    }
    if (!infos || found > *count) {
        *count = found;
        return found ? NVML_ERROR_INSUFFICIENT_SIZE : NVML_SUCCESS;
    }
    *count = found;
    return NVML_SUCCESS;
}

/* A driver before r570 does not know field 230 at all. */
static const char *recovery_action_default(void)
{
    const char *driver = lookup("driver_version");

    if (!driver || !isdigit((unsigned char)*driver))
        driver = FAKE_NVML_DRIVER_VERSION;
    return atoi(driver) < RECOVERY_ACTION_MIN_BRANCH ? "NOT_SUPPORTED" : "0";
}

/* NVML_FI_DEV_NVLINK_COUNT_* field ids -> scenario names (nvlink_count.<name>). */
static const struct { unsigned int id; const char *name; } nvlink_fields[NVLINK_FIELD_COUNTERS] = {
    {206, "malformed_packet"}, {207, "buffer_overrun"}, {208, "rcv"}, {209, "rcv_remote"},
    {210, "rcv_general"}, {211, "local_link_integrity"}, {213, "recovery_successful"},
    {214, "recovery_failed"}, {215, "link_recovery"}, {219, "effective"}, {221, "symbol"},
};

/* One NVLink5 counter of the link in scopeId, as an unsigned long long. */
static nvmlReturn_t nvlink_field(int gpu, int counter, nvmlFieldValue_t *field)
{
    unsigned int links;
    int blackwell = plain(gpu_value(gpu, "architecture"), 9) >= 10;

    TRY(gpu_uint(gpu, "nvlink.count", "18", &links));
    if (links == 0)
        return NVML_ERROR_NOT_SUPPORTED;
    if (field->scopeId >= links || field->scopeId >= MAX_NVLINKS)
        return NVML_ERROR_INVALID_ARGUMENT;
    field->valueType = 3; /* NVML_VALUE_TYPE_UNSIGNED_LONG_LONG */
    return growing(gpu, "nvlink_count", field->scopeId, nvlink_fields[counter].name,
                   blackwell ? "0" : "NOT_SUPPORTED",
                   &nvlink_field_reads[gpu][field->scopeId][counter], &field->value.ullVal);
}

/* Like the real call, errors of single fields go into their nvmlReturn, not the return value. */
nvmlReturn_t nvmlDeviceGetFieldValues(nvmlDevice_t dev, int count, nvmlFieldValue_t *fields)
{
    ENTER_DEVICE(dev);
    count_call(__func__, dev->index);
    for (int i = 0; i < count; i++) {
        nvmlFieldValue_t *field = &fields[i];
        const char *value = gpu_value(dev->index, "recovery_action");
        int counter = -1;

        if (!value)
            value = recovery_action_default();

        field->timestamp = (long long)time(NULL) * 1000000;
        field->latencyUsec = 0;
        field->valueType = 1; /* NVML_VALUE_TYPE_UNSIGNED_INT */
        field->value.ullVal = 0;
        for (int n = 0; n < NVLINK_FIELD_COUNTERS; n++)
            if (field->fieldId == nvlink_fields[n].id)
                counter = n;
        if (counter >= 0) {
            field->nvmlReturn = nvlink_field(dev->index, counter, field);
            continue;
        }
        if (field->fieldId != FIELD_GPU_RECOVERY_ACTION) {
            field->nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
            continue;
        }
        field->nvmlReturn = special(value);
        if (!field->nvmlReturn)
            field->value.uiVal = value ? (unsigned int)strtoul(value, NULL, 0) : 0;
    }
    return NVML_SUCCESS;
}
