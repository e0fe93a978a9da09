/*
 * fake_nvml.c - a fake libnvidia-ml.so.1 for gpuconsole's tests, demos and benchmarks.
 *
 * Build:  gcc -shared -fPIC -O2 -DFAKE_NVML_BRANCH=580 -Wl,-soname,libnvidia-ml.so.1 \
 *             -o libnvidia-ml.so.1 fake_nvml.c -lm
 * Use:    LD_LIBRARY_PATH=<dir> GPUCONSOLE_FAKE_NVML_PROFILE=<file> python -c 'import pynvml; ...'
 *
 * Any program that loads libnvidia-ml.so.1 (pynvml, gpustat, nvitop) runs against it unchanged.
 * The structure layouts and return codes follow nvml.h as nvidia-ml-py 13.615.71 declares them
 * in ctypes. A function this library lacks is simply not exported, so pynvml raises
 * NVMLError_FunctionNotFound for it, exactly as with an older driver.
 *
 * Driver branches. pynvml finds a function with dlsym (getattr on its ctypes CDLL) and raises
 * FunctionNotFound when the symbol is absent, so which functions a driver has is fixed when the
 * library is linked: one build per branch, FAKE_NVML_BRANCH=<major version> (default 580).
 * nvmlDeviceGetTemperatureV is compiled in from 560 only. What a branch's field ids mean and
 * which exist is decided at run time from the profile's driver_version, whose major version
 * must be the build's branch (otherwise nvmlInit fails, with the reason on stderr):
 *   PCIe byte counters 197/198: from 560, 32-bit (valueType 1), so they wrap.
 *   SW-thermal, HW-thermal, HW-power-brake time (ns): none up to 570; 251-253 on 575 and
 *     580.0-580.81; 269-271 from 580.82.
 *   Power-smoothing fields (eighteen, nvml.h order): 251-268 on 570 and from 580.82; 256-273 on
 *     575 and 580.0-580.81 (so there 269-271 are the active preset profile, the admin override
 *     TMP floor percent and the admin override ramp-up rate in mW/s).
 *   74 (power cap time) and 76 (sync boost time) in every branch.
 *   230 (the GPU recovery action): from 565 (older branches do not know it: NOT_SUPPORTED).
 * gpuconsole.sim.drivers holds the same facts for the Python side; a test keeps them equal.
 *
 * Environment
 *   GPUCONSOLE_FAKE_NVML_PROFILE  the profile file below. Unset or unreadable: nvmlInit* returns
 *                                 NVML_ERROR_DRIVER_NOT_LOADED (9), as on a machine without GPUs.
 *   GPUCONSOLE_FAKE_NVML_COUNTS   optional file; per-function call counts are written there
 *                                 ("name count" per line, non-zero only) at every nvmlShutdown
 *                                 and when the process exits.
 *   GPUCONSOLE_FAKE_NVML_TIME     optional: freeze the simulated clock at this many seconds
 *                                 after nvmlInit (for snapshot tests).
 *
 * Profile file format (gpuconsole.sim.fakenvml.write_profile writes it)
 *   One "key value..." per line; '#' starts a comment line; blank lines are ignored. Unknown
 *   keys are an error (reported on stderr; nvmlInit then fails with DRIVER_NOT_LOADED).
 *   Global keys:
 *     format 1
 *     node <name>                      seed <n>
 *     driver_version <major.minor.patch>  the driver played: its branch (major) must be the
 *                                      build's; major.minor picks what field ids mean
 *     nvml_version <text>              cuda_driver_version <int>
 *     virtualization_mode <n>          nvmlGpuVirtualizationMode_t, 0 = bare metal
 *     privileged <0|1>                 1 (the default): the caller is root. 0: an unprivileged
 *                                      user, answered NO_PERMISSION where a real driver answers
 *                                      it (see "Non-root" below)
 *     profiling_admin_only <0|1>       the driver's RmProfilingAdminOnly: 1 (the default, as
 *                                      the driver ships) keeps GPM from unprivileged users
 *     missing_field <field id>         a field this driver does not know (NOT_SUPPORTED), as
 *                                      on an older driver; repeat the key for several
 *     scenario <kind> <gpu> [at <seconds>]
 *        kind: thermal | ecc | notsupported | mig | smoothing | nvlinkerr | retired
 *              | xid<N> (xid79 = fell off the bus)
 *              | reset (the GPU is reset, as nvidia-smi --gpu-reset does: lost before, it answers
 *                again)
 *   "gpu <index>" opens a GPU block (indexes 0..n-1, in order); these keys then apply to it:
 *     name <text>  uuid <text>  serial <text>  bus_id <domain:bus:device.function>
 *     pci_device_id <hex>  pci_subsystem_id <hex>  minor <n>  module_id <n>  arch <n>  brand <n>
 *     sm_count <n> (the datasheet's; NVML answers SMs for MIG handles only)  memory_total <bytes>
 *     power_limits <min_mW> <max_mW> <default_mW>
 *     clocks_max <sm_MHz> <mem_MHz> <video_MHz>
 *     clock_sm_idle <MHz>  clock_sm_throttled <MHz>
 *     temp_thresholds <shutdown> <slowdown> <mem_max> <gpu_max>     (degrees C)
 *     numa_node <n>
 *     cpu_affinity_node <hex word0> [<hex word1> ...]    64-bit masks, CPU 0 = bit 0 of word 0
 *     cpu_affinity_socket <hex word0> ...
 *     pcie_max <gen> <width> <gpu_gen>
 *     fans <n>   gpm <0|1>   fabric <0|1>   nvlink_version <nvmlNvlinkVersion_t>
 *     fabric_probe <nvmlGpuFabricState_t> <nvmlReturn_t>   what nvmlDeviceGetGpuFabricInfo(V)
 *                                      answers as state and status where fabric is 1
 *                                      (default 3 0: completed, success)
 *     recovery_action <nvmlDeviceGpuRecoveryAction_t>   NVML_FI_DEV_GET_GPU_RECOVERY_ACTION
 *                                      (field 230, from 565 only; default 0, none)
 *     nvlink_bandwidth_gbs <GB/s, all links, both directions>
 *     nvlink <link> <remote bus id> <remote nvmlIntNvLinkDeviceType_t> <remote pci device id>
 *     board_part_number <text>  vbios_version <text>  inforom_image_version <text>
 *     mig_profile <profile index> <profile id> <slices> <SMs> <memory MiB> <max instances> <name>
 *     mig_instance <GPU instance id> <profile index> <placement start> <placement size> <MIG uuid>
 *     process <pid> <share of used memory, 0..1> <GPU instance id or -1>
 *     topology <level to GPU 0> <level to GPU 1> ...    nvmlGpuTopologyLevel_t values
 *     open_error <nvmlReturn_t>        the GPU is counted but cannot be opened: every
 *                                      nvmlDeviceGetHandleBy* answers this code (NO_PERMISSION,
 *                                      INSUFFICIENT_POWER and IRQ_ISSUE are what drivers give)
 *     fault <function> <nvmlReturn_t|nan|hang> [<GPU instance id>]
 *                                      <function> answers this code for this GPU (or for its MIG
 *                                      instance with that GPU instance id); hang: it never
 *                                      returns, as a GPU gone bad can leave a call in the
 *                                      kernel driver. Honoured by
 *                                      nvmlDeviceGetUUID, nvmlDeviceGetGpuInstanceId,
 *                                      nvmlDeviceGetMemoryInfo_v2 (the GPU itself),
 *                                      nvmlGpmMigSampleGet, nvmlGpmMetricsGet (nan: every metric
 *                                      succeeds with the value NaN) and
 *                                      nvmlDeviceGetComputeRunningProcesses_v3 (13, FUNCTION_NOT_FOUND,
 *                                      is how pynvml sees a driver without the symbol)
 *
 * Non-root (privileged 0), as nvml.h documents and DCGM#214 reports: memory information and the
 * running-process lists of a MIG-enabled GPU (not of its MIG devices),
 * nvmlDeviceGetGpuInstanceById, and GPM sampling (RmProfilingAdminOnly=1, the default) answer
 * NVML_ERROR_NO_PERMISSION (GPM only while profiling_admin_only is 1; a real H200 node with
 * RmProfilingAdminOnly=0 samples GPM for any user).
 *
 * Dynamics: a deterministic function of the seed and of t = seconds since the first nvmlInit in
 * the process (CLOCK_MONOTONIC). Each GPU (and each MIG GPU instance) has a smooth load u(t) in
 * 0..1 made of two sine waves with per-GPU periods and phases. Power follows u between the
 * minimum power limit and the TDP, temperature follows lagged power, the SM clock is at max under
 * load and idle clock when idle, memory used follows lagged load. Energy, PCIe and NVLink byte
 * counters and clock-event violation times are integrals of these, computed on a fixed 50 ms grid
 * so that a value depends only on t, never on how often it was read.
 *
 * Scenarios: thermal (hot, SM clock throttled, HW thermal slowdown and its violation counter),
 * nvlinkerr (link 0's replay, recovery and CRC error counters climb; fields 161-163), retired
 * (before Ampere: pages retired, one pending until a reset; fields 29-31, NOT_SUPPORTED from
 * Ampere on),
 * ecc (volatile corrected errors, a pending row remap), notsupported (every call but identity
 * returns NOT_SUPPORTED), mig (MIG mode on; instances from mig_instance lines), smoothing (an
 * administrator turns power smoothing on and sets a preset, a TMP floor and a ramp-up rate),
 * xid<N> (an XID event N is delivered to event sets; for 79 every later call on that GPU returns
 * GPU_IS_LOST, except nvmlDeviceGetUUID on a handle opened before, which the library answers from
 * its cache, until a reset scenario later than it). "at <s>" delays thermal, ecc, smoothing, nvlinkerr, retired and xid scenarios; mig and notsupported
 * hold from the start.
 *
 * An idle GPU (load under 2 %) trains its PCIe link down to generation 1, as real ones do
 * (nvidia-smi: the current generation "may be reduced when the GPU is not in use").
 * nvmlDeviceGetAttributes answers MIG device handles only, as nvml.h says the driver does.
 */

#ifndef FAKE_NVML_BRANCH
#define FAKE_NVML_BRANCH 580
#endif

#define _GNU_SOURCE
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

/* ------------------------------------------------------------------------------------------ */
/* NVML types and constants (as nvml.h and pynvml's ctypes declare them)                      */
/* ------------------------------------------------------------------------------------------ */

typedef unsigned int nvmlReturn_t;

enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3,
    NVML_ERROR_NO_PERMISSION = 4,
    NVML_ERROR_ALREADY_INITIALIZED = 5,
    NVML_ERROR_NOT_FOUND = 6,
    NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_INSUFFICIENT_POWER = 8,
    NVML_ERROR_DRIVER_NOT_LOADED = 9,
    NVML_ERROR_TIMEOUT = 10,
    NVML_ERROR_IRQ_ISSUE = 11,
    NVML_ERROR_LIBRARY_NOT_FOUND = 12,
    NVML_ERROR_FUNCTION_NOT_FOUND = 13,
    NVML_ERROR_CORRUPTED_INFOROM = 14,
    NVML_ERROR_GPU_IS_LOST = 15,
    NVML_ERROR_RESET_REQUIRED = 16,
    NVML_ERROR_OPERATING_SYSTEM = 17,
    NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18,
    NVML_ERROR_IN_USE = 19,
    NVML_ERROR_MEMORY = 20,
    NVML_ERROR_NO_DATA = 21,
    NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25,
    NVML_ERROR_UNKNOWN = 999,
};

#define NVML_VALUE_NOT_AVAILABLE_UINT 0xFFFFFFFFu
#define NVML_NVLINK_MAX_LINKS 36
#define NVML_GPM_METRIC_MAX 477 /* pynvml 13.615's array size; only numMetrics entries are read */

/* Versioned structures: (version << 24) | sizeof(struct). */
#define nvmlMemory_v2 0x02000028u
#define nvmlTemperature_v1 0x0100000Cu
#define nvmlGpuInstanceProfileInfo_v2 0x02000098u
#define nvmlGpuFabricInfo_v2 0x02000024u
#define nvmlGpuFabricInfo_v3 0x03000028u
#define NVML_GPM_METRICS_GET_VERSION 1u
#define NVML_GPM_SUPPORT_VERSION 1u

enum { NVML_CLOCK_GRAPHICS = 0, NVML_CLOCK_SM = 1, NVML_CLOCK_MEM = 2, NVML_CLOCK_VIDEO = 3 };
enum {
    NVML_CLOCK_ID_CURRENT = 0,
    NVML_CLOCK_ID_APP_CLOCK_TARGET = 1,
    NVML_CLOCK_ID_APP_CLOCK_DEFAULT = 2,
    NVML_CLOCK_ID_CUSTOMER_BOOST_MAX = 3,
};
enum { NVML_TEMPERATURE_GPU = 0 };
enum {
    NVML_TEMPERATURE_THRESHOLD_SHUTDOWN = 0,
    NVML_TEMPERATURE_THRESHOLD_SLOWDOWN = 1,
    NVML_TEMPERATURE_THRESHOLD_MEM_MAX = 2,
    NVML_TEMPERATURE_THRESHOLD_GPU_MAX = 3,
};
enum { NVML_PCIE_UTIL_TX_BYTES = 0, NVML_PCIE_UTIL_RX_BYTES = 1 };
enum { NVML_MEMORY_ERROR_TYPE_CORRECTED = 0, NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1 };
enum { NVML_VOLATILE_ECC = 0, NVML_AGGREGATE_ECC = 1 };
enum { NVML_AFFINITY_SCOPE_NODE = 0, NVML_AFFINITY_SCOPE_SOCKET = 1 };
enum { NVML_NVLINK_DEVICE_TYPE_GPU = 0, NVML_NVLINK_DEVICE_TYPE_SWITCH = 2 };
enum { NVML_P2P_CAPS_INDEX_NVLINK = 2, NVML_P2P_CAPS_INDEX_UNKNOWN = 5 };
enum { NVML_P2P_STATUS_OK = 0, NVML_P2P_STATUS_NOT_SUPPORTED = 5 };
enum { NVML_GPU_FABRIC_STATE_COMPLETED = 3 };
enum { NVML_GPU_FABRIC_HEALTH_SUMMARY_HEALTHY = 1 };
enum { NVML_DEVICE_ARCH_AMPERE = 7, NVML_DEVICE_ARCH_BLACKWELL = 10 };

#define nvmlEventTypeSingleBitEccError 0x0000000000000001ULL
#define nvmlEventTypeDoubleBitEccError 0x0000000000000002ULL
#define nvmlEventTypePState 0x0000000000000004ULL
#define nvmlEventTypeXidCriticalError 0x0000000000000008ULL
#define nvmlEventTypeClock 0x0000000000000010ULL
#define nvmlEventTypeDramRetirementEvent 0x0000000000000400ULL
#define nvmlEventTypeDramRetirementFailure 0x0000000000000800ULL

#define nvmlClocksEventReasonGpuIdle 0x0000000000000001ULL
#define nvmlClocksEventReasonSwPowerCap 0x0000000000000004ULL
#define nvmlClocksEventReasonHwThermalSlowdown 0x0000000000000040ULL
#define nvmlClocksEventReasonSupported 0x00000000000001FFULL

enum { /* field ids used below */
    NVML_FI_DEV_ECC_SBE_VOL_TOTAL = 3,
    NVML_FI_DEV_ECC_DBE_VOL_TOTAL = 4,
    NVML_FI_DEV_ECC_SBE_AGG_TOTAL = 5,
    NVML_FI_DEV_ECC_DBE_AGG_TOTAL = 6,
    NVML_FI_DEV_RETIRED_SBE = 29,
    NVML_FI_DEV_RETIRED_DBE = 30,
    NVML_FI_DEV_RETIRED_PENDING = 31,
    NVML_FI_DEV_PERF_POLICY_POWER = 74,
    NVML_FI_DEV_PERF_POLICY_SYNC_BOOST = 76,
    NVML_FI_DEV_MEMORY_TEMP = 82,
    NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION = 83,
    NVML_FI_DEV_NVLINK_LINK_COUNT = 91,
    NVML_FI_DEV_PCIE_REPLAY_COUNTER = 94,
    NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX = 138,
    NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX = 139,
    NVML_FI_DEV_REMAPPED_COR = 142,
    NVML_FI_DEV_REMAPPED_UNC = 143,
    NVML_FI_DEV_REMAPPED_PENDING = 144,
    NVML_FI_DEV_REMAPPED_FAILURE = 145,
    NVML_FI_DEV_NVSWITCH_CONNECTED_LINK_COUNT = 147,
    NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY = 161,
    NVML_FI_DEV_NVLINK_ERROR_DL_RECOVERY = 162,
    NVML_FI_DEV_NVLINK_ERROR_DL_CRC = 163,
    NVML_FI_DEV_NVLINK_GET_STATE = 165,
    NVML_FI_DEV_NVLINK_GET_VERSION = 166,
    NVML_FI_DEV_POWER_AVERAGE = 185,
    NVML_FI_DEV_POWER_INSTANT = 186,
    NVML_FI_DEV_POWER_CURRENT_LIMIT = 190,
    NVML_FI_DEV_TEMPERATURE_SHUTDOWN_TLIMIT = 193,
    NVML_FI_DEV_TEMPERATURE_SLOWDOWN_TLIMIT = 194,
    NVML_FI_DEV_PCIE_COUNT_TX_BYTES = 197,
    NVML_FI_DEV_PCIE_COUNT_RX_BYTES = 198,
    NVML_FI_DEV_GET_GPU_RECOVERY_ACTION = 230,
};
/* Clock-event time counters and power-smoothing fields: offsets from where a branch keeps them
 * (see the top of this file). */
enum { COUNTER_SW_THERMAL = 0, COUNTER_HW_THERMAL = 1, COUNTER_HW_POWER_BRAKE = 2, COUNTERS = 3 };
enum {
    SMOOTHING_ENABLED = 0,
    SMOOTHING_HW_CIRCUITRY_PERCENT_LIFETIME_REMAINING = 7,
    SMOOTHING_MAX_NUM_PRESET_PROFILES = 8,
    SMOOTHING_ACTIVE_PRESET_PROFILE = 13,
    SMOOTHING_ADMIN_OVERRIDE_PERCENT_TMP_FLOOR = 14,
    SMOOTHING_ADMIN_OVERRIDE_RAMP_UP_RATE = 15,
    SMOOTHING_FIELDS = 18,
};
enum { NVML_VALUE_TYPE_UNSIGNED_INT = 1, NVML_VALUE_TYPE_UNSIGNED_LONG_LONG = 3 };

typedef struct nvmlDevice_st *nvmlDevice_t;
typedef struct nvmlGpuInstance_st *nvmlGpuInstance_t;
typedef struct nvmlEventSet_st *nvmlEventSet_t;
typedef struct nvmlGpmSample_st *nvmlGpmSample_t;

typedef struct {
    char busIdLegacy[16];
    unsigned int domain;
    unsigned int bus;
    unsigned int device;
    unsigned int pciDeviceId;
    unsigned int pciSubSystemId;
    char busId[32];
} nvmlPciInfo_t; /* the _v3 layout */

typedef struct {
    unsigned long long total, free, used;
} nvmlMemory_t;

typedef struct {
    unsigned int version;
    unsigned long long total, reserved, free, used;
} nvmlMemory_v2_t;

typedef struct {
    unsigned int gpu, memory;
} nvmlUtilization_t;

typedef struct {
    unsigned int version;
    unsigned int sensorType;
    int temperature;
} nvmlTemperature_t;

typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId;
    unsigned int computeInstanceId;
} nvmlProcessInfo_t; /* the _v2 and _v3 layout */

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
    unsigned int fieldId;
    unsigned int scopeId;
    long long timestamp;
    long long latencyUsec;
    unsigned int valueType;
    nvmlReturn_t nvmlReturn;
    nvmlValue_t value;
} nvmlFieldValue_t;

typedef struct {
    unsigned int multiprocessorCount;
    unsigned int sharedCopyEngineCount;
    unsigned int sharedDecoderCount;
    unsigned int sharedEncoderCount;
    unsigned int sharedJpegCount;
    unsigned int sharedOfaCount;
    unsigned int gpuInstanceSliceCount;
    unsigned int computeInstanceSliceCount;
    unsigned long long memorySizeMB;
} nvmlDeviceAttributes_t;

typedef struct {
    unsigned long long bar1Total, bar1Free, bar1Used;
} nvmlBAR1Memory_t;

typedef struct {
    unsigned int pid;
    unsigned long long timeStamp;
    unsigned int smUtil, memUtil, encUtil, decUtil;
} nvmlProcessUtilizationSample_t;

typedef struct {
    unsigned int start, size;
} nvmlGpuInstancePlacement_t;

typedef struct {
    nvmlDevice_t device;
    unsigned int id;
    unsigned int profileId;
    nvmlGpuInstancePlacement_t placement;
} nvmlGpuInstanceInfo_t;

typedef struct {
    unsigned int id;
    unsigned int isP2pSupported;
    unsigned int sliceCount;
    unsigned int instanceCount;
    unsigned int multiprocessorCount;
    unsigned int copyEngineCount;
    unsigned int decoderCount;
    unsigned int encoderCount;
    unsigned int jpegCount;
    unsigned int ofaCount;
    unsigned long long memorySizeMB;
} nvmlGpuInstanceProfileInfo_t;

typedef struct {
    unsigned int version;
    unsigned int id;
    unsigned int isP2pSupported;
    unsigned int sliceCount;
    unsigned int instanceCount;
    unsigned int multiprocessorCount;
    unsigned int copyEngineCount;
    unsigned int decoderCount;
    unsigned int encoderCount;
    unsigned int jpegCount;
    unsigned int ofaCount;
    unsigned long long memorySizeMB;
    char name[96];
} nvmlGpuInstanceProfileInfo_v2_t;

typedef struct {
    unsigned char clusterUuid[16];
    nvmlReturn_t status;
    unsigned int cliqueId;
    unsigned int state;
} nvmlGpuFabricInfo_t;

typedef struct {
    unsigned int version;
    unsigned char clusterUuid[16];
    nvmlReturn_t status;
    unsigned int cliqueId;
    unsigned int state;
    unsigned int healthMask;
    unsigned char healthSummary; /* v3 only */
} nvmlGpuFabricInfoV_t;

typedef struct {
    nvmlDevice_t device;
    unsigned long long eventType;
    unsigned long long eventData;
    unsigned int gpuInstanceId;
    unsigned int computeInstanceId;
} nvmlEventData_t;

typedef struct {
    unsigned int version;
    unsigned int isSupportedDevice;
} nvmlGpmSupport_t;

typedef struct {
    unsigned int metricId;
    nvmlReturn_t nvmlReturn;
    double value;
    struct {
        const char *shortName;
        const char *longName;
        const char *unit;
    } metricInfo;
} nvmlGpmMetric_t;

typedef struct {
    unsigned int version;
    unsigned int numMetrics;
    nvmlGpmSample_t sample1;
    nvmlGpmSample_t sample2;
    nvmlGpmMetric_t metrics[NVML_GPM_METRIC_MAX];
} nvmlGpmMetricsGet_t;

/* ------------------------------------------------------------------------------------------ */
/* Call counters: one X-macro list of every exported NVML function                            */
/* ------------------------------------------------------------------------------------------ */

#define FAKE_NVML_FUNCTIONS(X)                                                                     \
    X(nvmlInit)                                                                                    \
    X(nvmlInit_v2)                                                                                 \
    X(nvmlInitWithFlags)                                                                           \
    X(nvmlShutdown)                                                                                \
    X(nvmlErrorString)                                                                             \
    X(nvmlSystemGetDriverVersion)                                                                  \
    X(nvmlSystemGetNVMLVersion)                                                                    \
    X(nvmlSystemGetCudaDriverVersion)                                                              \
    X(nvmlSystemGetCudaDriverVersion_v2)                                                           \
    X(nvmlSystemGetProcessName)                                                                    \
    X(nvmlDeviceGetCount)                                                                          \
    X(nvmlDeviceGetCount_v2)                                                                       \
    X(nvmlDeviceGetHandleByIndex)                                                                  \
    X(nvmlDeviceGetHandleByIndex_v2)                                                               \
    X(nvmlDeviceGetHandleByUUID)                                                                   \
    X(nvmlDeviceGetHandleBySerial)                                                                 \
    X(nvmlDeviceGetHandleByPciBusId)                                                               \
    X(nvmlDeviceGetHandleByPciBusId_v2)                                                            \
    X(nvmlDeviceGetName)                                                                           \
    X(nvmlDeviceGetUUID)                                                                           \
    X(nvmlDeviceGetSerial)                                                                         \
    X(nvmlDeviceGetIndex)                                                                          \
    X(nvmlDeviceGetMinorNumber)                                                                    \
    X(nvmlDeviceGetPciInfo_v3)                                                                     \
    X(nvmlDeviceGetModuleId)                                                                       \
    X(nvmlDeviceGetArchitecture)                                                                   \
    X(nvmlDeviceGetCudaComputeCapability)                                                          \
    X(nvmlDeviceGetAttributes_v2)                                                                  \
    X(nvmlDeviceGetBrand)                                                                          \
    X(nvmlDeviceGetBoardPartNumber)                                                                \
    X(nvmlDeviceGetVbiosVersion)                                                                   \
    X(nvmlDeviceGetInforomImageVersion)                                                            \
    X(nvmlDeviceGetMaxClockInfo)                                                                   \
    X(nvmlDeviceGetEnforcedPowerLimit)                                                             \
    X(nvmlDeviceGetPowerManagementMode)                                                            \
    X(nvmlDeviceGetPowerManagementLimit)                                                           \
    X(nvmlDeviceGetPowerManagementLimitConstraints)                                                \
    X(nvmlDeviceGetPowerManagementDefaultLimit)                                                    \
    X(nvmlDeviceGetTemperatureThreshold)                                                           \
    X(nvmlDeviceGetNumaNodeId)                                                                     \
    X(nvmlDeviceGetCpuAffinity)                                                                    \
    X(nvmlDeviceGetCpuAffinityWithinScope)                                                         \
    X(nvmlDeviceGetMemoryAffinity)                                                                 \
    X(nvmlDeviceGetMaxPcieLinkGeneration)                                                          \
    X(nvmlDeviceGetGpuMaxPcieLinkGeneration)                                                       \
    X(nvmlDeviceGetMaxPcieLinkWidth)                                                               \
    X(nvmlDeviceGetTopologyCommonAncestor)                                                         \
    X(nvmlDeviceGetP2PStatus)                                                                      \
    X(nvmlDeviceGetVirtualizationMode)                                                             \
    X(nvmlDeviceGetComputeMode)                                                                    \
    X(nvmlDeviceGetPersistenceMode)                                                                \
    X(nvmlDeviceGetDisplayActive)                                                                  \
    X(nvmlDeviceGetDisplayMode)                                                                    \
    X(nvmlDeviceGetFieldValues)                                                                    \
    X(nvmlDeviceGetUtilizationRates)                                                               \
    X(nvmlDeviceGetEncoderUtilization)                                                             \
    X(nvmlDeviceGetDecoderUtilization)                                                             \
    X(nvmlDeviceGetMemoryInfo)                                                                     \
    X(nvmlDeviceGetMemoryInfo_v2)                                                                  \
    X(nvmlDeviceGetBAR1MemoryInfo)                                                                 \
    X(nvmlDeviceGetTemperature)                                                                    \
    X(nvmlDeviceGetPowerUsage)                                                                     \
    X(nvmlDeviceGetTotalEnergyConsumption)                                                         \
    X(nvmlDeviceGetClockInfo)                                                                      \
    X(nvmlDeviceGetClock)                                                                          \
    X(nvmlDeviceGetPerformanceState)                                                               \
    X(nvmlDeviceGetPowerState)                                                                     \
    X(nvmlDeviceGetCurrentClocksEventReasons)                                                      \
    X(nvmlDeviceGetCurrentClocksThrottleReasons)                                                   \
    X(nvmlDeviceGetSupportedClocksEventReasons)                                                    \
    X(nvmlDeviceGetSupportedClocksThrottleReasons)                                                 \
    X(nvmlDeviceGetCurrPcieLinkGeneration)                                                         \
    X(nvmlDeviceGetCurrPcieLinkWidth)                                                              \
    X(nvmlDeviceGetPcieThroughput)                                                                 \
    X(nvmlDeviceGetPcieReplayCounter)                                                              \
    X(nvmlDeviceGetTotalEccErrors)                                                                 \
    X(nvmlDeviceGetEccMode)                                                                        \
    X(nvmlDeviceGetRemappedRows)                                                                   \
    X(nvmlDeviceGetRetiredPages)                                                                   \
    X(nvmlDeviceGetRetiredPagesPendingStatus)                                                      \
    X(nvmlDeviceGetFanSpeed)                                                                       \
    X(nvmlDeviceGetFanSpeed_v2)                                                                    \
    X(nvmlDeviceGetNumFans)                                                                        \
    X(nvmlDeviceGetComputeRunningProcesses_v2)                                                     \
    X(nvmlDeviceGetComputeRunningProcesses_v3)                                                     \
    X(nvmlDeviceGetGraphicsRunningProcesses_v2)                                                    \
    X(nvmlDeviceGetGraphicsRunningProcesses_v3)                                                    \
    X(nvmlDeviceGetMPSComputeRunningProcesses_v2)                                                  \
    X(nvmlDeviceGetMPSComputeRunningProcesses_v3)                                                  \
    X(nvmlDeviceGetProcessUtilization)                                                             \
    X(nvmlDeviceGetDriverModel)                                                                    \
    X(nvmlDeviceGetDriverModel_v2)                                                                 \
    X(nvmlDeviceGetGpuFabricInfo)                                                                  \
    X(nvmlDeviceGetGpuFabricInfoV)                                                                 \
    X(nvmlDeviceGetNvLinkState)                                                                    \
    X(nvmlDeviceGetNvLinkVersion)                                                                  \
    X(nvmlDeviceGetNvLinkCapability)                                                               \
    X(nvmlDeviceGetNvLinkRemotePciInfo_v2)                                                         \
    X(nvmlDeviceGetNvLinkRemoteDeviceType)                                                         \
    X(nvmlDeviceGetNvLinkErrorCounter)                                                             \
    X(nvmlDeviceGetMigMode)                                                                        \
    X(nvmlDeviceGetMaxMigDeviceCount)                                                              \
    X(nvmlDeviceGetMigDeviceHandleByIndex)                                                         \
    X(nvmlDeviceIsMigDeviceHandle)                                                                 \
    X(nvmlDeviceGetGpuInstanceId)                                                                  \
    X(nvmlDeviceGetComputeInstanceId)                                                              \
    X(nvmlDeviceGetDeviceHandleFromMigDeviceHandle)                                                \
    X(nvmlDeviceGetGpuInstanceById)                                                                \
    X(nvmlGpuInstanceGetInfo)                                                                      \
    X(nvmlDeviceGetGpuInstanceProfileInfo)                                                         \
    X(nvmlDeviceGetGpuInstanceProfileInfoV)                                                        \
    X(nvmlGpmQueryDeviceSupport)                                                                   \
    X(nvmlGpmSampleAlloc)                                                                          \
    X(nvmlGpmSampleFree)                                                                           \
    X(nvmlGpmSampleGet)                                                                            \
    X(nvmlGpmMigSampleGet)                                                                         \
    X(nvmlGpmMetricsGet)                                                                           \
    X(nvmlEventSetCreate)                                                                          \
    X(nvmlDeviceRegisterEvents)                                                                    \
    X(nvmlDeviceGetSupportedEventTypes)                                                            \
    X(nvmlEventSetWait_v2)                                                                         \
    X(nvmlEventSetFree)

/* Functions a branch gained, compiled in only from that branch on. */
#if FAKE_NVML_BRANCH >= 560
#define FAKE_NVML_FUNCTIONS_R560(X) X(nvmlDeviceGetTemperatureV)
#else
#define FAKE_NVML_FUNCTIONS_R560(X)
#endif

#define FAKE_NVML_EXPORTS(X) FAKE_NVML_FUNCTIONS(X) FAKE_NVML_FUNCTIONS_R560(X)

#define AS_ENUM(fn) FN_##fn,
#define AS_NAME(fn) #fn,
enum { FAKE_NVML_EXPORTS(AS_ENUM) FN_COUNT };
static const char *const g_fn_names[FN_COUNT] = {FAKE_NVML_EXPORTS(AS_NAME)};
static unsigned long long g_calls[FN_COUNT];

#define COUNT(fn) __atomic_fetch_add(&g_calls[FN_##fn], 1ULL, __ATOMIC_RELAXED)

/* ------------------------------------------------------------------------------------------ */
/* The profile: one table of GPUs                                                             */
/* ------------------------------------------------------------------------------------------ */

#define MAX_GPUS 16
#define MAX_MIG 7
#define MAX_MIG_PROFILES 16
#define MAX_PROCS 16
#define MAX_SCENARIOS 64
#define CPU_WORDS 16
#define TEXT 96

typedef struct {
    unsigned index, profile_id, slices, sm_count, max_instances;
    unsigned long long mem_mb;
    char name[32];
} mig_profile_t;

typedef struct {
    unsigned gi_id;
    int profile; /* index into gpu_t.mig_profiles */
    unsigned start, size;
    char uuid[TEXT];
} mig_instance_t;

typedef struct {
    unsigned pid;
    double share;
    int gi_id; /* -1 outside MIG */
} proc_t;

typedef struct {
    char bus_id[32];
    unsigned remote_type, remote_pci_device_id;
} nvlink_t;

#define FAULT_NAN 0xFFFFFFFEu /* a fault "code": the call succeeds with NaN values */
#define FAULT_HANG 0xFFFFFFFDu /* a fault "code": the call never returns */
#define MAX_FAULTS 8

typedef struct {
    int fn;            /* FN_* of the function */
    nvmlReturn_t code; /* or FAULT_NAN, FAULT_HANG */
    int gi_id;         /* -1: the GPU itself */
} fault_t;

typedef struct {
    int index;
    char name[TEXT], uuid[TEXT], serial[32], bus_id[32];
    unsigned domain, bus, device, function;
    unsigned pci_device_id, pci_subsystem_id, minor, module_id, arch, brand, sm_count;
    unsigned long long memory_total;
    unsigned power_min_mw, power_max_mw, power_default_mw;
    unsigned clock_sm_max, clock_mem_max, clock_video_max, clock_sm_idle, clock_sm_throttled;
    unsigned temp_shutdown, temp_slowdown, temp_mem_max, temp_gpu_max;
    int numa_node;
    int cpu_words;
    unsigned long long cpu_node[CPU_WORDS], cpu_socket[CPU_WORDS];
    unsigned pcie_gen_max, pcie_width_max, pcie_gpu_gen_max;
    unsigned fans, gpm, fabric, nvlink_version;
    unsigned fabric_state;
    nvmlReturn_t fabric_status;
    unsigned recovery_action;
    double nvlink_bandwidth_gbs;
    int nlinks;
    nvlink_t links[NVML_NVLINK_MAX_LINKS];
    char board_part[TEXT], vbios[32], inforom[16];
    int n_mig_profiles;
    mig_profile_t mig_profiles[MAX_MIG_PROFILES];
    int n_mig;
    mig_instance_t mig[MAX_MIG];
    int nprocs;
    proc_t procs[MAX_PROCS];
    int ntopo;
    unsigned topo[MAX_GPUS];
    nvmlReturn_t open_error;
    int nfaults;
    fault_t faults[MAX_FAULTS];
} gpu_t;

typedef struct {
    char kind[16]; /* thermal, ecc, notsupported, mig, smoothing, xid, reset, nvlinkerr, retired */
    unsigned xid;
    int gpu;
    double at;
} scenario_t;

typedef struct {
    char node[TEXT];
    unsigned long long seed;
    char driver_version[TEXT], nvml_version[TEXT];
    int driver_major, driver_minor; /* 580, 82 of "580.82.07" */
    int cuda_driver_version;
    unsigned virtualization_mode;
    int privileged;
    int profiling_admin_only;
    int ngpus;
    gpu_t gpus[MAX_GPUS];
    int nscenarios;
    unsigned missing_fields[32];
    int nmissing_fields;
    scenario_t scenarios[MAX_SCENARIOS];
} profile_t;

static profile_t g_prof;
static profile_t g_parse; /* parsed into, then copied over g_prof */
static unsigned long long g_prof_hash;
static int g_init_count;
static int g_t0_set;
static double g_t0;
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;

/* Opaque handles are pointers into these static tables. */
#define DEVICE_MAGIC 0x4e564d4cu
#define GI_MAGIC 0x4e564749u
#define EVENTSET_MAGIC 0x4e564553u
#define GPM_MAGIC 0x4e56474du

struct nvmlDevice_st {
    unsigned magic;
    int gpu;
    int mig; /* -1 = the physical GPU, else MIG slot */
};
struct nvmlGpuInstance_st {
    unsigned magic;
    int gpu;
    int slot;
};
static struct nvmlDevice_st g_devices[MAX_GPUS];
static struct nvmlDevice_st g_mig_devices[MAX_GPUS][MAX_MIG];
static struct nvmlGpuInstance_st g_gpu_instances[MAX_GPUS][MAX_MIG];

/* ------------------------------------------------------------------------------------------ */
/* Small helpers                                                                              */
/* ------------------------------------------------------------------------------------------ */

static double mono_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static long long realtime_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (long long)ts.tv_sec * 1000000LL + ts.tv_nsec / 1000;
}

/* Simulated seconds since the first nvmlInit of this process. */
static double sim_time(void) {
    const char *frozen = getenv("GPUCONSOLE_FAKE_NVML_TIME");
    if (frozen && *frozen)
        return strtod(frozen, NULL);
    return g_t0_set ? mono_now() - g_t0 : 0.0;
}

static uint64_t mix64(uint64_t x) { /* splitmix64 finaliser */
    x += 0x9E3779B97F4A7C15ULL;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
    return x ^ (x >> 31);
}

static double unit(uint64_t h) { return (double)(h >> 11) * (1.0 / 9007199254740992.0); }

static uint64_t fnv1a(const char *s) {
    uint64_t h = 0xcbf29ce484222325ULL;
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 0x100000001b3ULL;
    return h;
}

static double clamp01(double x) { return x < 0.0 ? 0.0 : (x > 1.0 ? 1.0 : x); }

/* Copy a string into an NVML output buffer, INSUFFICIENT_SIZE when it does not fit. */
static nvmlReturn_t put_string(char *buf, unsigned int len, const char *value) {
    if (!buf)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(value) + 1 > len)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    strcpy(buf, value);
    return NVML_SUCCESS;
}

/* ------------------------------------------------------------------------------------------ */
/* Scenarios                                                                                  */
/* ------------------------------------------------------------------------------------------ */

static const scenario_t *find_scenario(int gpu, const char *kind) {
    for (int i = 0; i < g_prof.nscenarios; i++) {
        const scenario_t *s = &g_prof.scenarios[i];
        if (s->gpu == gpu && strcmp(s->kind, kind) == 0)
            return s;
    }
    return NULL;
}

static int scenario_active(int gpu, const char *kind, double t) {
    const scenario_t *s = find_scenario(gpu, kind);
    return s && t >= s->at;
}

/* A page retirement (the retired scenario) waits for a reset: pending from its start until a
 * reset scenario at or after it; the pages stay retired. */
static int retirement_pending(int gpu, double t) {
    const scenario_t *r = find_scenario(gpu, "retired");
    if (!r || t < r->at)
        return 0;
    for (int i = 0; i < g_prof.nscenarios; i++) {
        const scenario_t *s = &g_prof.scenarios[i];
        if (s->gpu == gpu && strcmp(s->kind, "reset") == 0 && s->at >= r->at && t >= s->at)
            return 0;
    }
    return 1;
}

/* Lost from an XID 79 on, until a reset after it. */
static int gpu_lost(int gpu, double t) {
    double fell = -1.0, reset = -1.0;
    for (int i = 0; i < g_prof.nscenarios; i++) {
        const scenario_t *s = &g_prof.scenarios[i];
        if (s->gpu != gpu || t < s->at)
            continue;
        if (strcmp(s->kind, "xid") == 0 && s->xid == 79 && s->at > fell)
            fell = s->at;
        else if (strcmp(s->kind, "reset") == 0 && s->at > reset)
            reset = s->at;
    }
    return fell >= 0.0 && reset < fell;
}

static int mig_enabled(const gpu_t *g) { return find_scenario(g->index, "mig") != NULL; }

/* The code a `fault` line gives function fn on GPU g (gi_id -1) or its GPU instance gi_id;
 * NVML_SUCCESS where there is none. */
static nvmlReturn_t fault(const gpu_t *g, int fn, int gi_id) {
    for (int i = 0; i < g->nfaults; i++)
        if (g->faults[i].fn == fn && g->faults[i].gi_id == gi_id) {
            while (g->faults[i].code == FAULT_HANG)
                pause(); /* a signal wakes it: the call goes on not returning */
            return g->faults[i].code;
        }
    return NVML_SUCCESS;
}

/* What an unprivileged caller may not read of a MIG-enabled GPU itself: its memory and its
 * process lists (its MIG devices answer both). */
static int parent_denied(const gpu_t *g, int slot) {
    return !g_prof.privileged && slot < 0 && mig_enabled(g);
}

/* ------------------------------------------------------------------------------------------ */
/* Profile parsing                                                                            */
/* ------------------------------------------------------------------------------------------ */

static int parse_bus_id(const char *text, unsigned *domain, unsigned *bus, unsigned *device,
                        unsigned *function) {
    unsigned d = 0, b = 0, dev = 0, fn = 0;
    if (sscanf(text, "%x:%x:%x.%x", &d, &b, &dev, &fn) == 4) {
        /* full form */
    } else if (sscanf(text, "%x:%x.%x", &b, &dev, &fn) == 3) {
        d = 0;
    } else {
        return -1;
    }
    *domain = d;
    *bus = b;
    *device = dev;
    *function = fn;
    return 0;
}

static int parse_hex_words(const char *rest, unsigned long long *words, int max) {
    int n = 0;
    char *end;
    const char *p = rest;
    while (*p && n < max) {
        while (isspace((unsigned char)*p))
            p++;
        if (!*p)
            break;
        words[n++] = strtoull(p, &end, 16);
        if (end == p)
            return -1;
        p = end;
    }
    return n;
}

static void copy_text(char *dst, size_t size, const char *src) {
    snprintf(dst, size, "%s", src);
}

#define NEED(n)                                                                                    \
    do {                                                                                           \
        if (got != (n))                                                                            \
            goto bad;                                                                              \
    } while (0)

static int parse_profile(FILE *f, profile_t *p, char *err, size_t errlen) {
    char line[1024];
    int lineno = 0;
    gpu_t *g = NULL;
    memset(p, 0, sizeof(*p));
    p->privileged = 1;
    p->profiling_admin_only = 1;
    while (fgets(line, sizeof line, f)) {
        lineno++;
        size_t len = strlen(line);
        while (len && (line[len - 1] == '\n' || line[len - 1] == '\r' || line[len - 1] == ' '))
            line[--len] = 0;
        char *key = line;
        while (isspace((unsigned char)*key))
            key++;
        if (!*key || *key == '#')
            continue;
        char *rest = key;
        while (*rest && !isspace((unsigned char)*rest))
            rest++;
        if (*rest)
            *rest++ = 0;
        while (isspace((unsigned char)*rest))
            rest++;
        int got = 0;

        if (!strcmp(key, "format")) {
            if (atoi(rest) != 1)
                goto bad;
        } else if (!strcmp(key, "node")) {
            copy_text(p->node, sizeof p->node, rest);
        } else if (!strcmp(key, "seed")) {
            p->seed = strtoull(rest, NULL, 10);
        } else if (!strcmp(key, "driver_version")) {
            copy_text(p->driver_version, sizeof p->driver_version, rest);
            p->driver_minor = 0;
            if (sscanf(rest, "%d.%d", &p->driver_major, &p->driver_minor) < 1)
                goto bad;
        } else if (!strcmp(key, "nvml_version")) {
            copy_text(p->nvml_version, sizeof p->nvml_version, rest);
        } else if (!strcmp(key, "cuda_driver_version")) {
            p->cuda_driver_version = atoi(rest);
        } else if (!strcmp(key, "virtualization_mode")) {
            p->virtualization_mode = (unsigned)atoi(rest);
        } else if (!strcmp(key, "privileged")) {
            if (strcmp(rest, "0") && strcmp(rest, "1"))
                goto bad;
            p->privileged = atoi(rest);
        } else if (!strcmp(key, "profiling_admin_only")) {
            if (strcmp(rest, "0") && strcmp(rest, "1"))
                goto bad;
            p->profiling_admin_only = atoi(rest);
        } else if (!strcmp(key, "missing_field")) {
            if (p->nmissing_fields >= 32)
                goto bad;
            p->missing_fields[p->nmissing_fields++] = (unsigned)atoi(rest);
        } else if (!strcmp(key, "scenario")) {
            if (p->nscenarios >= MAX_SCENARIOS)
                goto bad;
            scenario_t *s = &p->scenarios[p->nscenarios];
            char kind[32];
            double at = 0.0;
            got = sscanf(rest, "%31s %d at %lf", kind, &s->gpu, &at);
            if (got < 2)
                goto bad;
            s->at = at;
            if (!strncmp(kind, "xid", 3)) {
                s->xid = (unsigned)atoi(kind + 3);
                if (s->xid == 0)
                    goto bad;
                strcpy(s->kind, "xid");
            } else if (!strcmp(kind, "thermal") || !strcmp(kind, "ecc") ||
                       !strcmp(kind, "notsupported") || !strcmp(kind, "mig") ||
                       !strcmp(kind, "smoothing") || !strcmp(kind, "reset") ||
                       !strcmp(kind, "nvlinkerr") || !strcmp(kind, "retired")) {
                strcpy(s->kind, kind);
            } else {
                goto bad;
            }
            p->nscenarios++;
        } else if (!strcmp(key, "gpu")) {
            int idx = atoi(rest);
            if (idx != p->ngpus || p->ngpus >= MAX_GPUS)
                goto bad;
            g = &p->gpus[p->ngpus++];
            g->index = idx;
            g->fabric_state = NVML_GPU_FABRIC_STATE_COMPLETED;
        } else if (!g) {
            goto bad; /* every other key belongs to a GPU block */
        } else if (!strcmp(key, "name")) {
            copy_text(g->name, sizeof g->name, rest);
        } else if (!strcmp(key, "uuid")) {
            copy_text(g->uuid, sizeof g->uuid, rest);
        } else if (!strcmp(key, "serial")) {
            copy_text(g->serial, sizeof g->serial, rest);
        } else if (!strcmp(key, "bus_id")) {
            if (parse_bus_id(rest, &g->domain, &g->bus, &g->device, &g->function))
                goto bad;
            snprintf(g->bus_id, sizeof g->bus_id, "%08X:%02X:%02X.%X", g->domain, g->bus,
                     g->device, g->function);
        } else if (!strcmp(key, "pci_device_id")) {
            g->pci_device_id = (unsigned)strtoul(rest, NULL, 16);
        } else if (!strcmp(key, "pci_subsystem_id")) {
            g->pci_subsystem_id = (unsigned)strtoul(rest, NULL, 16);
        } else if (!strcmp(key, "minor")) {
            g->minor = (unsigned)atoi(rest);
        } else if (!strcmp(key, "module_id")) {
            g->module_id = (unsigned)atoi(rest);
        } else if (!strcmp(key, "arch")) {
            g->arch = (unsigned)atoi(rest);
        } else if (!strcmp(key, "brand")) {
            g->brand = (unsigned)atoi(rest);
        } else if (!strcmp(key, "sm_count")) {
            g->sm_count = (unsigned)atoi(rest);
        } else if (!strcmp(key, "memory_total")) {
            g->memory_total = strtoull(rest, NULL, 10);
        } else if (!strcmp(key, "power_limits")) {
            got = sscanf(rest, "%u %u %u", &g->power_min_mw, &g->power_max_mw,
                         &g->power_default_mw);
            NEED(3);
        } else if (!strcmp(key, "clocks_max")) {
            got = sscanf(rest, "%u %u %u", &g->clock_sm_max, &g->clock_mem_max,
                         &g->clock_video_max);
            NEED(3);
        } else if (!strcmp(key, "clock_sm_idle")) {
            g->clock_sm_idle = (unsigned)atoi(rest);
        } else if (!strcmp(key, "clock_sm_throttled")) {
            g->clock_sm_throttled = (unsigned)atoi(rest);
        } else if (!strcmp(key, "temp_thresholds")) {
            got = sscanf(rest, "%u %u %u %u", &g->temp_shutdown, &g->temp_slowdown,
                         &g->temp_mem_max, &g->temp_gpu_max);
            NEED(4);
        } else if (!strcmp(key, "numa_node")) {
            g->numa_node = atoi(rest);
        } else if (!strcmp(key, "cpu_affinity_node")) {
            int n = parse_hex_words(rest, g->cpu_node, CPU_WORDS);
            if (n <= 0)
                goto bad;
            if (n > g->cpu_words)
                g->cpu_words = n;
        } else if (!strcmp(key, "cpu_affinity_socket")) {
            int n = parse_hex_words(rest, g->cpu_socket, CPU_WORDS);
            if (n <= 0)
                goto bad;
            if (n > g->cpu_words)
                g->cpu_words = n;
        } else if (!strcmp(key, "pcie_max")) {
            got = sscanf(rest, "%u %u %u", &g->pcie_gen_max, &g->pcie_width_max,
                         &g->pcie_gpu_gen_max);
            NEED(3);
        } else if (!strcmp(key, "fans")) {
            g->fans = (unsigned)atoi(rest);
        } else if (!strcmp(key, "gpm")) {
            g->gpm = (unsigned)atoi(rest);
        } else if (!strcmp(key, "fabric")) {
            g->fabric = (unsigned)atoi(rest);
        } else if (!strcmp(key, "fabric_probe")) {
            got = sscanf(rest, "%u %u", &g->fabric_state, &g->fabric_status);
            NEED(2);
        } else if (!strcmp(key, "recovery_action")) {
            g->recovery_action = (unsigned)atoi(rest);
        } else if (!strcmp(key, "nvlink_version")) {
            g->nvlink_version = (unsigned)atoi(rest);
        } else if (!strcmp(key, "nvlink_bandwidth_gbs")) {
            g->nvlink_bandwidth_gbs = strtod(rest, NULL);
        } else if (!strcmp(key, "nvlink")) {
            int link;
            char bus[64];
            unsigned type, devid;
            got = sscanf(rest, "%d %63s %u %x", &link, bus, &type, &devid);
            NEED(4);
            if (link != g->nlinks || link >= NVML_NVLINK_MAX_LINKS)
                goto bad;
            nvlink_t *l = &g->links[g->nlinks++];
            unsigned d, b, dv, fn;
            if (parse_bus_id(bus, &d, &b, &dv, &fn))
                goto bad;
            snprintf(l->bus_id, sizeof l->bus_id, "%08X:%02X:%02X.%X", d, b, dv, fn);
            l->remote_type = type;
            l->remote_pci_device_id = devid;
        } else if (!strcmp(key, "board_part_number")) {
            copy_text(g->board_part, sizeof g->board_part, rest);
        } else if (!strcmp(key, "vbios_version")) {
            copy_text(g->vbios, sizeof g->vbios, rest);
        } else if (!strcmp(key, "inforom_image_version")) {
            copy_text(g->inforom, sizeof g->inforom, rest);
        } else if (!strcmp(key, "mig_profile")) {
            if (g->n_mig_profiles >= MAX_MIG_PROFILES)
                goto bad;
            mig_profile_t *m = &g->mig_profiles[g->n_mig_profiles];
            got = sscanf(rest, "%u %u %u %u %llu %u %31s", &m->index, &m->profile_id, &m->slices,
                         &m->sm_count, &m->mem_mb, &m->max_instances, m->name);
            NEED(7);
            g->n_mig_profiles++;
        } else if (!strcmp(key, "mig_instance")) {
            if (g->n_mig >= MAX_MIG)
                goto bad;
            mig_instance_t *m = &g->mig[g->n_mig];
            unsigned pindex;
            got = sscanf(rest, "%u %u %u %u %95s", &m->gi_id, &pindex, &m->start, &m->size,
                         m->uuid);
            NEED(5);
            m->profile = -1;
            for (int i = 0; i < g->n_mig_profiles; i++)
                if (g->mig_profiles[i].index == pindex)
                    m->profile = i;
            if (m->profile < 0)
                goto bad; /* mig_profile lines must come first */
            g->n_mig++;
        } else if (!strcmp(key, "process")) {
            if (g->nprocs >= MAX_PROCS)
                goto bad;
            proc_t *pr = &g->procs[g->nprocs];
            got = sscanf(rest, "%u %lf %d", &pr->pid, &pr->share, &pr->gi_id);
            NEED(3);
            g->nprocs++;
        } else if (!strcmp(key, "open_error")) {
            g->open_error = (nvmlReturn_t)atoi(rest);
            if (g->open_error == NVML_SUCCESS)
                goto bad;
        } else if (!strcmp(key, "fault")) {
            if (g->nfaults >= MAX_FAULTS)
                goto bad;
            fault_t *ft = &g->faults[g->nfaults];
            char fn[96], code[16];
            int gi = -1;
            got = sscanf(rest, "%95s %15s %d", fn, code, &gi);
            if (got < 2)
                goto bad;
            ft->fn = -1;
            for (int i = 0; i < FN_COUNT; i++)
                if (!strcmp(g_fn_names[i], fn))
                    ft->fn = i;
            if (ft->fn < 0)
                goto bad;
            ft->code = !strcmp(code, "nan")    ? FAULT_NAN
                       : !strcmp(code, "hang") ? FAULT_HANG
                                               : (nvmlReturn_t)strtoul(code, NULL, 10);
            if (ft->code == NVML_SUCCESS)
                goto bad;
            ft->gi_id = gi;
            g->nfaults++;
        } else if (!strcmp(key, "topology")) {
            unsigned long long levels[MAX_GPUS];
            char *end;
            const char *q = rest;
            int n = 0;
            while (*q && n < MAX_GPUS) {
                levels[n] = strtoull(q, &end, 10);
                if (end == q)
                    break;
                n++;
                q = end;
            }
            for (int i = 0; i < n; i++)
                g->topo[i] = (unsigned)levels[i];
            g->ntopo = n;
        } else {
            goto bad;
        }
        continue;
    bad:
        snprintf(err, errlen, "line %d: cannot use %s %s", lineno, key, rest);
        return -1;
    }
    if (p->ngpus == 0) {
        snprintf(err, errlen, "no gpu blocks");
        return -1;
    }
    if (p->driver_major != FAKE_NVML_BRANCH) {
        snprintf(err, errlen,
                 "driver_version %s is not branch %d, the one this library was built for "
                 "(its exports differ: build it with -DFAKE_NVML_BRANCH=%d)",
                 p->driver_version[0] ? p->driver_version : "(none)", FAKE_NVML_BRANCH,
                 p->driver_major);
        return -1;
    }
    for (int i = 0; i < p->nscenarios; i++) {
        if (p->scenarios[i].gpu < 0 || p->scenarios[i].gpu >= p->ngpus) {
            snprintf(err, errlen, "scenario %s names GPU %d, which does not exist",
                     p->scenarios[i].kind, p->scenarios[i].gpu);
            return -1;
        }
    }
    return 0;
}

/* Read the profile named by GPUCONSOLE_FAKE_NVML_PROFILE; 0 on success. Caller holds g_lock. */
static int load_profile(void) {
    const char *path = getenv("GPUCONSOLE_FAKE_NVML_PROFILE");
    if (!path || !*path)
        return -1;
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    char err[512];
    int rc = parse_profile(f, &g_parse, err, sizeof err);
    fclose(f);
    if (rc) {
        fprintf(stderr, "fake libnvidia-ml: %s: %s\n", path, err);
        return -1;
    }
    memcpy(&g_prof, &g_parse, sizeof g_prof);
    for (int i = 0; i < MAX_GPUS; i++) {
        g_devices[i] = (struct nvmlDevice_st){DEVICE_MAGIC, i, -1};
        for (int k = 0; k < MAX_MIG; k++) {
            g_mig_devices[i][k] = (struct nvmlDevice_st){DEVICE_MAGIC, i, k};
            g_gpu_instances[i][k] = (struct nvmlGpuInstance_st){GI_MAGIC, i, k};
        }
    }
    return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* Dynamics                                                                                   */
/* ------------------------------------------------------------------------------------------ */

#define GRID_S 0.05

/* Load in 0..1 of GPU g (slot -1) or of its MIG GPU instance in slot `slot`. */
static double slot_load(const gpu_t *g, int slot, double t) {
    uint64_t h = mix64(g_prof_hash ^ mix64((uint64_t)g->index * 131 + (uint64_t)(slot + 1)));
    double mean = 0.2 + 0.65 * unit(mix64(h ^ 1));
    double p1 = 45.0 + 75.0 * unit(mix64(h ^ 2));
    double p2 = 6.0 + 9.0 * unit(mix64(h ^ 3));
    double ph1 = 2 * M_PI * unit(mix64(h ^ 4));
    double ph2 = 2 * M_PI * unit(mix64(h ^ 5));
    double u = mean + 0.4 * sin(2 * M_PI * t / p1 + ph1) + 0.1 * sin(2 * M_PI * t / p2 + ph2);
    return clamp01(u);
}

static unsigned total_slices(const gpu_t *g) {
    unsigned most = 0;
    for (int i = 0; i < g->n_mig_profiles; i++)
        if (g->mig_profiles[i].slices > most)
            most = g->mig_profiles[i].slices;
    return most ? most : 7;
}

static unsigned instance_slices(const gpu_t *g, int slot) {
    return g->mig_profiles[g->mig[slot].profile].slices;
}

static double gpu_load(const gpu_t *g, double t) {
    if (!mig_enabled(g))
        return slot_load(g, -1, t);
    double sum = 0.0;
    for (int i = 0; i < g->n_mig; i++)
        sum += instance_slices(g, i) * slot_load(g, i, t);
    return sum / total_slices(g);
}

static int power_capped(const gpu_t *g, double t) {
    return gpu_load(g, t) > 0.95 && !scenario_active(g->index, "thermal", t);
}

typedef struct {
    double u;              /* integral of gpu_load, seconds */
    double u_slot[MAX_MIG]; /* integral of each MIG instance's load */
    double capped_s;       /* time at the power cap */
    double thermal_s;      /* time in HW thermal slowdown */
} integrals_t;

typedef struct {
    long steps; /* grid cells already summed */
    integrals_t sum;
} integrator_t;

static integrator_t g_integ[MAX_GPUS];

static void integrand(const gpu_t *g, double t, integrals_t *v) {
    v->u = gpu_load(g, t);
    for (int i = 0; i < g->n_mig && mig_enabled(g); i++)
        v->u_slot[i] = slot_load(g, i, t);
    v->capped_s = power_capped(g, t) ? 1.0 : 0.0;
    v->thermal_s = scenario_active(g->index, "thermal", t) ? 1.0 : 0.0;
}

static void add_scaled(integrals_t *acc, const integrals_t *v, double dt) {
    acc->u += v->u * dt;
    for (int i = 0; i < MAX_MIG; i++)
        acc->u_slot[i] += v->u_slot[i] * dt;
    acc->capped_s += v->capped_s * dt;
    acc->thermal_s += v->thermal_s * dt;
}

/* Integrals from 0 to t, summed on a fixed grid (midpoint rule) so they depend on t alone. */
static void integrals_at(const gpu_t *g, double t, integrals_t *out) {
    if (t < 0)
        t = 0;
    long cells = (long)floor(t / GRID_S);
    pthread_mutex_lock(&g_lock);
    integrator_t *it = &g_integ[g->index];
    if (it->steps > cells)
        memset(it, 0, sizeof(*it)); /* time went back (frozen clock changed): start over */
    while (it->steps < cells) {
        integrals_t v = {0};
        integrand(g, (it->steps + 0.5) * GRID_S, &v);
        add_scaled(&it->sum, &v, GRID_S);
        it->steps++;
    }
    *out = it->sum;
    pthread_mutex_unlock(&g_lock);
    integrals_t v = {0};
    integrand(g, t, &v);
    add_scaled(out, &v, t - cells * GRID_S);
}

typedef struct {
    double u;
    double power_w;
    double temp_c, mem_temp_c;
    unsigned sm_clock;
    unsigned long long reasons;
    int thermal, capped, idle;
} state_t;

static double power_at(const gpu_t *g, double t) {
    double lo = g->power_min_mw / 1000.0, hi = g->power_max_mw / 1000.0;
    double p = lo + (hi - lo) * gpu_load(g, t);
    if (scenario_active(g->index, "thermal", t))
        p *= 0.8; /* throttled clocks draw less */
    return p;
}

static void state_at(const gpu_t *g, double t, state_t *s) {
    memset(s, 0, sizeof(*s));
    s->u = gpu_load(g, t);
    s->power_w = power_at(g, t);
    s->thermal = scenario_active(g->index, "thermal", t);
    s->capped = power_capped(g, t);
    s->idle = s->u < 0.02;
    /* Temperature follows power with a lag of a few seconds. */
    double lag = 0.6 * gpu_load(g, t - 3.0) + 0.4 * gpu_load(g, t - 10.0);
    double busy = g->temp_slowdown > 40 ? g->temp_slowdown - 17.0 : 68.0;
    s->temp_c = 30.0 + (busy - 30.0) * lag;
    s->mem_temp_c = s->temp_c + 5.0;
    if (s->thermal) {
        s->temp_c = g->temp_slowdown + 2.0 + 0.5 * sin(t / 7.0);
        s->mem_temp_c = s->temp_c + 4.0;
        s->sm_clock = g->clock_sm_throttled;
        s->reasons = nvmlClocksEventReasonHwThermalSlowdown;
    } else if (s->idle) {
        s->sm_clock = g->clock_sm_idle;
        s->reasons = nvmlClocksEventReasonGpuIdle;
    } else if (s->capped) {
        s->sm_clock = (unsigned)(g->clock_sm_max * 0.95 / 15.0) * 15;
        s->reasons = nvmlClocksEventReasonSwPowerCap;
    } else {
        s->sm_clock = g->clock_sm_max;
    }
}

/* Counters derived from the integrals. */
static double pcie_rate_scale(const gpu_t *g) { return g->pcie_gen_max >= 5 ? 1.0 : 0.5; }

static double pcie_bytes(const gpu_t *g, double t, const integrals_t *in, int rx) {
    double s = pcie_rate_scale(g);
    return rx ? s * (3e6 * t + 1.5e9 * in->u) : s * (2e6 * t + 0.6e9 * in->u);
}

static double pcie_rate(const gpu_t *g, double u, int rx) { /* bytes/s */
    double s = pcie_rate_scale(g);
    return rx ? s * (3e6 + 1.5e9 * u) : s * (2e6 + 0.6e9 * u);
}

/* Bytes per second, per direction, on one link at full load: half the link's peak. */
static double nvlink_link_peak(const gpu_t *g) {
    if (g->nlinks == 0)
        return 0.0;
    return g->nvlink_bandwidth_gbs * 1e9 / 2.0 / g->nlinks * 0.5;
}

static double nvlink_weight(int link, int rx) {
    return (1.0 + 0.04 * sin(link * 1.7)) * (rx ? 0.97 : 1.0);
}

static double nvlink_bytes(const gpu_t *g, const integrals_t *in, int link, int rx) {
    return nvlink_link_peak(g) * nvlink_weight(link, rx) * in->u;
}

static double energy_mj(const gpu_t *g, double t, const integrals_t *in) {
    double lo = g->power_min_mw / 1000.0, hi = g->power_max_mw / 1000.0;
    /* thermal throttling draws 20 % less while active */
    double joules = lo * t + (hi - lo) * in->u - 0.2 * lo * in->thermal_s;
    return joules * 1000.0;
}

/* Memory used by processes on slot (-1 = whole GPU), following lagged load. */
static unsigned long long slot_total(const gpu_t *g, int slot) {
    if (slot < 0)
        return g->memory_total;
    return g->mig_profiles[g->mig[slot].profile].mem_mb * 1024ULL * 1024ULL;
}

static unsigned long long reserved_bytes(const gpu_t *g) {
    return (unsigned long long)(g->memory_total * 0.0067) / (1024 * 1024) * (1024 * 1024);
}

static int slot_has_procs(const gpu_t *g, int slot) {
    int gi = slot < 0 ? -1 : (int)g->mig[slot].gi_id;
    for (int i = 0; i < g->nprocs; i++)
        if (slot < 0 || g->procs[i].gi_id == gi)
            return 1;
    return 0;
}

static unsigned long long slot_used(const gpu_t *g, int slot, double t) {
    if (slot < 0 && mig_enabled(g)) {
        unsigned long long sum = 0;
        for (int i = 0; i < g->n_mig; i++)
            sum += slot_used(g, i, t);
        return sum;
    }
    if (!slot_has_procs(g, slot))
        return 0;
    double lag = slot_load(g, slot, t - 5.0);
    double avail = (double)slot_total(g, slot) - (slot < 0 ? (double)reserved_bytes(g) : 0.0);
    unsigned long long used = (unsigned long long)(avail * (0.1 + 0.8 * lag));
    return used / (1024 * 1024) * (1024 * 1024);
}

/* ------------------------------------------------------------------------------------------ */
/* Handle checks                                                                              */
/* ------------------------------------------------------------------------------------------ */

enum { IDENTITY = 1, ALLOW_MIG = 2, CACHED = 4 };

static int valid_device(nvmlDevice_t d) {
    if (!d || d->magic != DEVICE_MAGIC || d->gpu < 0 || d->gpu >= g_prof.ngpus)
        return 0;
    if (d->mig >= 0) {
        const gpu_t *g = &g_prof.gpus[d->gpu];
        return d == &g_mig_devices[d->gpu][d->mig] && mig_enabled(g) && d->mig < g->n_mig;
    }
    return d == &g_devices[d->gpu];
}

/* The checks every device call makes, in NVML's order. */
static nvmlReturn_t check_device(nvmlDevice_t d, int flags) {
    if (g_init_count <= 0)
        return NVML_ERROR_UNINITIALIZED;
    if (!valid_device(d))
        return NVML_ERROR_INVALID_ARGUMENT;
    double t = sim_time();
    if (!(flags & CACHED) && gpu_lost(d->gpu, t))
        return NVML_ERROR_GPU_IS_LOST;
    if (!(flags & IDENTITY) && scenario_active(d->gpu, "notsupported", t))
        return NVML_ERROR_NOT_SUPPORTED;
    if (d->mig >= 0 && !(flags & ALLOW_MIG))
        return NVML_ERROR_NOT_SUPPORTED;
    return NVML_SUCCESS;
}

/* Declares `g` (the GPU) and `slot` (MIG slot or -1) after the checks pass. */
#define DEVICE(d, flags)                                                                           \
    nvmlReturn_t check_ = check_device((d), (flags));                                              \
    if (check_ != NVML_SUCCESS)                                                                    \
        return check_;                                                                             \
    gpu_t *g = &g_prof.gpus[(d)->gpu];                                                             \
    int slot = (d)->mig;                                                                           \
    (void)g;                                                                                       \
    (void)slot

#define OUT(p)                                                                                     \
    do {                                                                                           \
        if (!(p))                                                                                  \
            return NVML_ERROR_INVALID_ARGUMENT;                                                    \
    } while (0)

#define INITIALIZED()                                                                              \
    do {                                                                                           \
        if (g_init_count <= 0)                                                                     \
            return NVML_ERROR_UNINITIALIZED;                                                       \
    } while (0)

/* ------------------------------------------------------------------------------------------ */
/* Call counts: exported for gpuconsole.sim.fakenvml                                          */
/* ------------------------------------------------------------------------------------------ */

int fake_nvml_function_count(void) { return FN_COUNT; }

const char *fake_nvml_function_name(int i) { return i >= 0 && i < FN_COUNT ? g_fn_names[i] : NULL; }

unsigned long long fake_nvml_call_count(int i) {
    return i >= 0 && i < FN_COUNT ? __atomic_load_n(&g_calls[i], __ATOMIC_RELAXED) : 0ULL;
}

unsigned long long fake_nvml_call_count_total(void) {
    unsigned long long total = 0;
    for (int i = 0; i < FN_COUNT; i++)
        total += __atomic_load_n(&g_calls[i], __ATOMIC_RELAXED);
    return total;
}

void fake_nvml_reset_call_counts(void) {
    for (int i = 0; i < FN_COUNT; i++)
        __atomic_store_n(&g_calls[i], 0ULL, __ATOMIC_RELAXED);
}

/* Write "name count" lines to GPUCONSOLE_FAKE_NVML_COUNTS (atomically: temp file + rename). */
int fake_nvml_write_counts(void) {
    const char *path = getenv("GPUCONSOLE_FAKE_NVML_COUNTS");
    if (!path || !*path)
        return 0;
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.%d.tmp", path, (int)getpid());
    FILE *f = fopen(tmp, "w");
    if (!f)
        return -1;
    for (int i = 0; i < FN_COUNT; i++) {
        unsigned long long n = __atomic_load_n(&g_calls[i], __ATOMIC_RELAXED);
        if (n)
            fprintf(f, "%s %llu\n", g_fn_names[i], n);
    }
    if (fclose(f) != 0)
        return -1;
    return rename(tmp, path);
}

__attribute__((destructor)) static void write_counts_at_exit(void) { fake_nvml_write_counts(); }

/* ------------------------------------------------------------------------------------------ */
/* System                                                                                     */
/* ------------------------------------------------------------------------------------------ */

static nvmlReturn_t do_init(void) {
    pthread_mutex_lock(&g_lock);
    if (g_init_count == 0) {
        if (load_profile() != 0) {
            pthread_mutex_unlock(&g_lock);
            return NVML_ERROR_DRIVER_NOT_LOADED;
        }
        uint64_t h = mix64(fnv1a(g_prof.node) ^ mix64(g_prof.seed));
        if (h != g_prof_hash)
            memset(g_integ, 0, sizeof g_integ);
        g_prof_hash = h;
        if (!g_t0_set) {
            g_t0 = mono_now();
            g_t0_set = 1;
        }
    }
    g_init_count++;
    pthread_mutex_unlock(&g_lock);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlInit(void) {
    COUNT(nvmlInit);
    return do_init();
}

nvmlReturn_t nvmlInit_v2(void) {
    COUNT(nvmlInit_v2);
    return do_init();
}

nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
    COUNT(nvmlInitWithFlags);
    (void)flags;
    return do_init();
}

nvmlReturn_t nvmlShutdown(void) {
    COUNT(nvmlShutdown);
    pthread_mutex_lock(&g_lock);
    if (g_init_count <= 0) {
        pthread_mutex_unlock(&g_lock);
        return NVML_ERROR_UNINITIALIZED;
    }
    g_init_count--;
    pthread_mutex_unlock(&g_lock);
    fake_nvml_write_counts();
    return NVML_SUCCESS;
}

const char *nvmlErrorString(nvmlReturn_t result) {
    COUNT(nvmlErrorString);
    switch (result) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_NO_PERMISSION: return "Insufficient Permissions";
    case NVML_ERROR_ALREADY_INITIALIZED: return "Already Initialized";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_INSUFFICIENT_POWER: return "Insufficient External Power";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    case NVML_ERROR_TIMEOUT: return "Timeout";
    case NVML_ERROR_IRQ_ISSUE: return "Interrupt Request Issue";
    case NVML_ERROR_LIBRARY_NOT_FOUND: return "NVML Shared Library Not Found";
    case NVML_ERROR_FUNCTION_NOT_FOUND: return "Function Not Found";
    case NVML_ERROR_CORRUPTED_INFOROM: return "Corrupted infoROM";
    case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
    case NVML_ERROR_RESET_REQUIRED: return "GPU requires restart";
    case NVML_ERROR_OPERATING_SYSTEM: return "The operating system has blocked the request.";
    case NVML_ERROR_LIB_RM_VERSION_MISMATCH: return "RM has detected an NVML/RM version mismatch.";
    case NVML_ERROR_IN_USE: return "In use by another client";
    case NVML_ERROR_MEMORY: return "Insufficient Memory";
    case NVML_ERROR_NO_DATA: return "No data";
    case NVML_ERROR_ARGUMENT_VERSION_MISMATCH: return "Argument version mismatch";
    default: return "Unknown Error";
    }
}

nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    COUNT(nvmlSystemGetDriverVersion);
    INITIALIZED();
    return put_string(version, length, g_prof.driver_version);
}

nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length) {
    COUNT(nvmlSystemGetNVMLVersion);
    INITIALIZED();
    return put_string(version, length, g_prof.nvml_version);
}

nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *cudaDriverVersion) {
    COUNT(nvmlSystemGetCudaDriverVersion);
    OUT(cudaDriverVersion);
    INITIALIZED();
    *cudaDriverVersion = g_prof.cuda_driver_version;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *cudaDriverVersion) {
    COUNT(nvmlSystemGetCudaDriverVersion_v2);
    OUT(cudaDriverVersion);
    INITIALIZED();
    *cudaDriverVersion = g_prof.cuda_driver_version;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlSystemGetProcessName(unsigned int pid, char *name, unsigned int length) {
    COUNT(nvmlSystemGetProcessName);
    INITIALIZED();
    for (int i = 0; i < g_prof.ngpus; i++)
        for (int k = 0; k < g_prof.gpus[i].nprocs; k++)
            if (g_prof.gpus[i].procs[k].pid == pid)
                return put_string(name, length, "python3");
    return NVML_ERROR_NOT_FOUND;
}

static nvmlReturn_t get_count(unsigned int *deviceCount) {
    OUT(deviceCount);
    INITIALIZED();
    *deviceCount = (unsigned)g_prof.ngpus;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetCount(unsigned int *deviceCount) {
    COUNT(nvmlDeviceGetCount);
    return get_count(deviceCount);
}

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *deviceCount) {
    COUNT(nvmlDeviceGetCount_v2);
    return get_count(deviceCount);
}

/* ------------------------------------------------------------------------------------------ */
/* Handles and identity                                                                       */
/* ------------------------------------------------------------------------------------------ */

/* A handle for GPU i: lost GPUs cannot be opened (nvidia-smi: "Unable to determine the device
 * handle for GPU ...: GPU is lost"). */
static nvmlReturn_t open_gpu(int i, nvmlDevice_t *device) {
    if (g_prof.gpus[i].open_error != NVML_SUCCESS)
        return g_prof.gpus[i].open_error;
    if (gpu_lost(i, sim_time()))
        return NVML_ERROR_GPU_IS_LOST;
    *device = &g_devices[i];
    return NVML_SUCCESS;
}

static nvmlReturn_t handle_by_index(unsigned int index, nvmlDevice_t *device) {
    OUT(device);
    INITIALIZED();
    if (index >= (unsigned)g_prof.ngpus)
        return NVML_ERROR_INVALID_ARGUMENT;
    return open_gpu((int)index, device);
}

nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t *device) {
    COUNT(nvmlDeviceGetHandleByIndex);
    return handle_by_index(index, device);
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    COUNT(nvmlDeviceGetHandleByIndex_v2);
    return handle_by_index(index, device);
}

nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device) {
    COUNT(nvmlDeviceGetHandleByUUID);
    OUT(uuid && device);
    INITIALIZED();
    for (int i = 0; i < g_prof.ngpus; i++) {
        gpu_t *g = &g_prof.gpus[i];
        if (!strcasecmp(g->uuid, uuid))
            return open_gpu(i, device);
        for (int k = 0; k < g->n_mig && mig_enabled(g); k++) {
            if (!strcasecmp(g->mig[k].uuid, uuid)) {
                if (g->open_error != NVML_SUCCESS)
                    return g->open_error;
                if (gpu_lost(i, sim_time()))
                    return NVML_ERROR_GPU_IS_LOST;
                *device = &g_mig_devices[i][k];
                return NVML_SUCCESS;
            }
        }
    }
    return NVML_ERROR_NOT_FOUND;
}

nvmlReturn_t nvmlDeviceGetHandleBySerial(const char *serial, nvmlDevice_t *device) {
    COUNT(nvmlDeviceGetHandleBySerial);
    OUT(serial && device);
    INITIALIZED();
    for (int i = 0; i < g_prof.ngpus; i++)
        if (!strcmp(g_prof.gpus[i].serial, serial))
            return open_gpu(i, device);
    return NVML_ERROR_NOT_FOUND;
}

static nvmlReturn_t handle_by_bus_id(const char *busId, nvmlDevice_t *device) {
    OUT(busId && device);
    INITIALIZED();
    unsigned d, b, dev, fn;
    if (parse_bus_id(busId, &d, &b, &dev, &fn))
        return NVML_ERROR_INVALID_ARGUMENT;
    for (int i = 0; i < g_prof.ngpus; i++) {
        const gpu_t *g = &g_prof.gpus[i];
        if (g->domain == d && g->bus == b && g->device == dev && g->function == fn)
            return open_gpu(i, device);
    }
    return NVML_ERROR_NOT_FOUND;
}

nvmlReturn_t nvmlDeviceGetHandleByPciBusId(const char *pciBusId, nvmlDevice_t *device) {
    COUNT(nvmlDeviceGetHandleByPciBusId);
    return handle_by_bus_id(pciBusId, device);
}

nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char *pciBusId, nvmlDevice_t *device) {
    COUNT(nvmlDeviceGetHandleByPciBusId_v2);
    return handle_by_bus_id(pciBusId, device);
}

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length) {
    COUNT(nvmlDeviceGetName);
    DEVICE(device, IDENTITY | ALLOW_MIG);
    if (slot >= 0) {
        char text[2 * TEXT];
        snprintf(text, sizeof text, "%s MIG %s", g->name,
                 g->mig_profiles[g->mig[slot].profile].name);
        return put_string(name, length, text);
    }
    return put_string(name, length, g->name);
}

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length) {
    COUNT(nvmlDeviceGetUUID);
    DEVICE(device, IDENTITY | ALLOW_MIG | CACHED);
    nvmlReturn_t broken = fault(g, FN_nvmlDeviceGetUUID, slot < 0 ? -1 : (int)g->mig[slot].gi_id);
    if (broken != NVML_SUCCESS)
        return broken;
    return put_string(uuid, length, slot >= 0 ? g->mig[slot].uuid : g->uuid);
}

nvmlReturn_t nvmlDeviceGetSerial(nvmlDevice_t device, char *serial, unsigned int length) {
    COUNT(nvmlDeviceGetSerial);
    DEVICE(device, IDENTITY);
    return put_string(serial, length, g->serial);
}

nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index) {
    COUNT(nvmlDeviceGetIndex);
    OUT(index);
    DEVICE(device, IDENTITY);
    *index = (unsigned)g->index;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t device, unsigned int *minorNumber) {
    COUNT(nvmlDeviceGetMinorNumber);
    OUT(minorNumber);
    DEVICE(device, IDENTITY);
    *minorNumber = g->minor;
    return NVML_SUCCESS;
}

static void fill_pci(nvmlPciInfo_t *pci, unsigned domain, unsigned bus, unsigned dev,
                     unsigned fn, unsigned device_id, unsigned subsystem_id) {
    memset(pci, 0, sizeof(*pci));
    snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, "%04X:%02X:%02X.%X", domain & 0xFFFF, bus,
             dev, fn);
    snprintf(pci->busId, sizeof pci->busId, "%08X:%02X:%02X.%X", domain, bus, dev, fn);
    pci->domain = domain;
    pci->bus = bus;
    pci->device = dev;
    pci->pciDeviceId = device_id;
    pci->pciSubSystemId = subsystem_id;
}

nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t *pci) {
    COUNT(nvmlDeviceGetPciInfo_v3);
    OUT(pci);
    DEVICE(device, IDENTITY);
    fill_pci(pci, g->domain, g->bus, g->device, g->function, g->pci_device_id,
             g->pci_subsystem_id);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetModuleId(nvmlDevice_t device, unsigned int *moduleId) {
    COUNT(nvmlDeviceGetModuleId);
    OUT(moduleId);
    DEVICE(device, IDENTITY);
    *moduleId = g->module_id;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetArchitecture(nvmlDevice_t device, unsigned int *arch) {
    COUNT(nvmlDeviceGetArchitecture);
    OUT(arch);
    DEVICE(device, IDENTITY);
    *arch = g->arch;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t device, int *major, int *minor) {
    COUNT(nvmlDeviceGetCudaComputeCapability);
    OUT(major && minor);
    DEVICE(device, IDENTITY | ALLOW_MIG);
    /* Hopper 9.0, Ampere GA100 8.0, Volta 7.0 */
    *major = g->arch >= 9 ? 9 : g->arch >= NVML_DEVICE_ARCH_AMPERE ? 8 : 7;
    *minor = 0;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetBrand(nvmlDevice_t device, unsigned int *type) {
    COUNT(nvmlDeviceGetBrand);
    OUT(type);
    DEVICE(device, IDENTITY);
    *type = g->brand;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetBoardPartNumber(nvmlDevice_t device, char *partNumber,
                                          unsigned int length) {
    COUNT(nvmlDeviceGetBoardPartNumber);
    DEVICE(device, IDENTITY);
    return put_string(partNumber, length, g->board_part);
}

nvmlReturn_t nvmlDeviceGetVbiosVersion(nvmlDevice_t device, char *version, unsigned int length) {
    COUNT(nvmlDeviceGetVbiosVersion);
    DEVICE(device, IDENTITY);
    return put_string(version, length, g->vbios);
}

nvmlReturn_t nvmlDeviceGetInforomImageVersion(nvmlDevice_t device, char *version,
                                              unsigned int length) {
    COUNT(nvmlDeviceGetInforomImageVersion);
    DEVICE(device, IDENTITY);
    return put_string(version, length, g->inforom);
}

nvmlReturn_t nvmlDeviceGetAttributes_v2(nvmlDevice_t device, nvmlDeviceAttributes_t *attributes) {
    COUNT(nvmlDeviceGetAttributes_v2);
    OUT(attributes);
    DEVICE(device, ALLOW_MIG);
    if (slot < 0)
        return NVML_ERROR_NOT_SUPPORTED; /* nvml.h: "only supports MIG device handles" */
    memset(attributes, 0, sizeof(*attributes));
    const mig_profile_t *p = &g->mig_profiles[g->mig[slot].profile];
    attributes->multiprocessorCount = p->sm_count;
    attributes->sharedCopyEngineCount = p->slices;
    attributes->sharedDecoderCount = p->slices >= 2 ? p->slices / 2 + (p->slices == 7) : 0;
    attributes->sharedJpegCount = p->slices == 7 ? 1 : 0;
    attributes->sharedOfaCount = p->slices == 7 ? 1 : 0;
    attributes->gpuInstanceSliceCount = p->slices;
    attributes->computeInstanceSliceCount = p->slices;
    attributes->memorySizeMB = p->mem_mb;
    return NVML_SUCCESS;
}

/* ------------------------------------------------------------------------------------------ */
/* Static limits                                                                              */
/* ------------------------------------------------------------------------------------------ */

nvmlReturn_t nvmlDeviceGetMaxClockInfo(nvmlDevice_t device, unsigned int type,
                                       unsigned int *clock) {
    COUNT(nvmlDeviceGetMaxClockInfo);
    OUT(clock);
    DEVICE(device, 0);
    switch (type) {
    case NVML_CLOCK_GRAPHICS:
    case NVML_CLOCK_SM: *clock = g->clock_sm_max; return NVML_SUCCESS;
    case NVML_CLOCK_MEM: *clock = g->clock_mem_max; return NVML_SUCCESS;
    case NVML_CLOCK_VIDEO: *clock = g->clock_video_max; return NVML_SUCCESS;
    default: return NVML_ERROR_INVALID_ARGUMENT;
    }
}

nvmlReturn_t nvmlDeviceGetEnforcedPowerLimit(nvmlDevice_t device, unsigned int *limit) {
    COUNT(nvmlDeviceGetEnforcedPowerLimit);
    OUT(limit);
    DEVICE(device, 0);
    *limit = g->power_default_mw;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetPowerManagementMode(nvmlDevice_t device, unsigned int *mode) {
    COUNT(nvmlDeviceGetPowerManagementMode);
    OUT(mode);
    DEVICE(device, 0);
    *mode = 1;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetPowerManagementLimit(nvmlDevice_t device, unsigned int *limit) {
    COUNT(nvmlDeviceGetPowerManagementLimit);
    OUT(limit);
    DEVICE(device, 0);
    *limit = g->power_default_mw;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetPowerManagementLimitConstraints(nvmlDevice_t device,
                                                          unsigned int *minLimit,
                                                          unsigned int *maxLimit) {
    COUNT(nvmlDeviceGetPowerManagementLimitConstraints);
    OUT(minLimit && maxLimit);
    DEVICE(device, 0);
    *minLimit = g->power_min_mw;
    *maxLimit = g->power_max_mw;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetPowerManagementDefaultLimit(nvmlDevice_t device,
                                                      unsigned int *defaultLimit) {
    COUNT(nvmlDeviceGetPowerManagementDefaultLimit);
    OUT(defaultLimit);
    DEVICE(device, 0);
    *defaultLimit = g->power_default_mw;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetTemperatureThreshold(nvmlDevice_t device, unsigned int thresholdType,
                                               unsigned int *temp) {
    COUNT(nvmlDeviceGetTemperatureThreshold);
    OUT(temp);
    DEVICE(device, 0);
    switch (thresholdType) {
    case NVML_TEMPERATURE_THRESHOLD_SHUTDOWN: *temp = g->temp_shutdown; return NVML_SUCCESS;
    case NVML_TEMPERATURE_THRESHOLD_SLOWDOWN: *temp = g->temp_slowdown; return NVML_SUCCESS;
    case NVML_TEMPERATURE_THRESHOLD_MEM_MAX: *temp = g->temp_mem_max; return NVML_SUCCESS;
    case NVML_TEMPERATURE_THRESHOLD_GPU_MAX: *temp = g->temp_gpu_max; return NVML_SUCCESS;
    default: return NVML_ERROR_NOT_SUPPORTED; /* acoustic thresholds: not on datacenter parts */
    }
}

nvmlReturn_t nvmlDeviceGetNumaNodeId(nvmlDevice_t device, unsigned int *node) {
    COUNT(nvmlDeviceGetNumaNodeId);
    OUT(node);
    DEVICE(device, 0);
    *node = (unsigned)g->numa_node;
    return NVML_SUCCESS;
}

static void copy_mask(unsigned long *dst, unsigned int n, const unsigned long long *src,
                      int words) {
    for (unsigned i = 0; i < n; i++)
        dst[i] = i < (unsigned)words ? (unsigned long)src[i] : 0UL;
}

nvmlReturn_t nvmlDeviceGetCpuAffinity(nvmlDevice_t device, unsigned int cpuSetSize,
                                      unsigned long *cpuSet) {
    COUNT(nvmlDeviceGetCpuAffinity);
    OUT(cpuSet);
    DEVICE(device, 0);
    copy_mask(cpuSet, cpuSetSize, g->cpu_node, g->cpu_words);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetCpuAffinityWithinScope(nvmlDevice_t device, unsigned int cpuSetSize,
                                                 unsigned long *cpuSet, unsigned int scope) {
    COUNT(nvmlDeviceGetCpuAffinityWithinScope);
    OUT(cpuSet);
    DEVICE(device, 0);
    if (scope == NVML_AFFINITY_SCOPE_NODE)
        copy_mask(cpuSet, cpuSetSize, g->cpu_node, g->cpu_words);
    else if (scope == NVML_AFFINITY_SCOPE_SOCKET)
        copy_mask(cpuSet, cpuSetSize, g->cpu_socket, g->cpu_words);
    else
        return NVML_ERROR_INVALID_ARGUMENT;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMemoryAffinity(nvmlDevice_t device, unsigned int nodeSetSize,
                                         unsigned long *nodeSet, unsigned int scope) {
    COUNT(nvmlDeviceGetMemoryAffinity);
    OUT(nodeSet);
    DEVICE(device, 0);
    if (scope > NVML_AFFINITY_SCOPE_SOCKET)
        return NVML_ERROR_INVALID_ARGUMENT;
    for (unsigned i = 0; i < nodeSetSize; i++)
        nodeSet[i] = 0;
    unsigned word = (unsigned)g->numa_node / 64;
    if (word < nodeSetSize)
        nodeSet[word] = 1UL << ((unsigned)g->numa_node % 64);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMaxPcieLinkGeneration(nvmlDevice_t device, unsigned int *maxLinkGen) {
    COUNT(nvmlDeviceGetMaxPcieLinkGeneration);
    OUT(maxLinkGen);
    DEVICE(device, 0);
    *maxLinkGen = g->pcie_gen_max;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetGpuMaxPcieLinkGeneration(nvmlDevice_t device,
                                                   unsigned int *maxLinkGenDevice) {
    COUNT(nvmlDeviceGetGpuMaxPcieLinkGeneration);
    OUT(maxLinkGenDevice);
    DEVICE(device, 0);
    *maxLinkGenDevice = g->pcie_gpu_gen_max;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMaxPcieLinkWidth(nvmlDevice_t device, unsigned int *maxLinkWidth) {
    COUNT(nvmlDeviceGetMaxPcieLinkWidth);
    OUT(maxLinkWidth);
    DEVICE(device, 0);
    *maxLinkWidth = g->pcie_width_max;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetTopologyCommonAncestor(nvmlDevice_t device1, nvmlDevice_t device2,
                                                 unsigned int *pathInfo) {
    COUNT(nvmlDeviceGetTopologyCommonAncestor);
    OUT(pathInfo);
    nvmlReturn_t r = check_device(device2, 0);
    if (r != NVML_SUCCESS)
        return r;
    DEVICE(device1, 0);
    int other = device2->gpu;
    if (other >= g->ntopo)
        return NVML_ERROR_NOT_SUPPORTED;
    *pathInfo = g->topo[other];
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetP2PStatus(nvmlDevice_t device1, nvmlDevice_t device2,
                                    unsigned int p2pIndex, unsigned int *p2pStatus) {
    COUNT(nvmlDeviceGetP2PStatus);
    OUT(p2pStatus);
    nvmlReturn_t r = check_device(device2, 0);
    if (r != NVML_SUCCESS)
        return r;
    DEVICE(device1, 0);
    if (p2pIndex >= NVML_P2P_CAPS_INDEX_UNKNOWN)
        return NVML_ERROR_INVALID_ARGUMENT;
    const gpu_t *o = &g_prof.gpus[device2->gpu];
    if (p2pIndex == NVML_P2P_CAPS_INDEX_NVLINK)
        *p2pStatus = (g->nlinks && o->nlinks && g != o) ? NVML_P2P_STATUS_OK
                                                        : NVML_P2P_STATUS_NOT_SUPPORTED;
    else
        *p2pStatus = NVML_P2P_STATUS_OK;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetVirtualizationMode(nvmlDevice_t device, unsigned int *pVirtualMode) {
    COUNT(nvmlDeviceGetVirtualizationMode);
    OUT(pVirtualMode);
    DEVICE(device, 0);
    *pVirtualMode = g_prof.virtualization_mode;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetComputeMode(nvmlDevice_t device, unsigned int *mode) {
    COUNT(nvmlDeviceGetComputeMode);
    OUT(mode);
    DEVICE(device, 0);
    *mode = 0; /* NVML_COMPUTEMODE_DEFAULT */
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetPersistenceMode(nvmlDevice_t device, unsigned int *mode) {
    COUNT(nvmlDeviceGetPersistenceMode);
    OUT(mode);
    DEVICE(device, 0);
    *mode = 1; /* NVML_FEATURE_ENABLED: DGX OS runs nvidia-persistenced */
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetDisplayActive(nvmlDevice_t device, unsigned int *isActive) {
    COUNT(nvmlDeviceGetDisplayActive);
    OUT(isActive);
    DEVICE(device, 0);
    *isActive = 0;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetDisplayMode(nvmlDevice_t device, unsigned int *display) {
    COUNT(nvmlDeviceGetDisplayMode);
    OUT(display);
    DEVICE(device, 0);
    *display = 0;
    return NVML_SUCCESS;
}

/* ------------------------------------------------------------------------------------------ */
/* Dynamic readings                                                                           */
/* ------------------------------------------------------------------------------------------ */

typedef struct {
    unsigned long long sbe_vol, dbe_vol, sbe_agg, dbe_agg;
    unsigned remap_cor, remap_unc, remap_pending, remap_failure;
} ecc_t;

static void ecc_at(const gpu_t *g, double t, ecc_t *e) {
    memset(e, 0, sizeof(*e));
    const scenario_t *s = find_scenario(g->index, "ecc");
    if (!s || t < s->at)
        return;
    e->sbe_vol = 3 + (unsigned long long)((t - s->at) / 15.0);
    e->sbe_agg = e->sbe_vol + 12;
    e->remap_cor = 1;
    e->remap_pending = 1;
}

/* The nvlinkerr scenario: link 0's data link replays 3 and CRC errors 10 times a second from
 * its start, and it retrains (a recovery) every 20 s; every other link stays clean. */
static unsigned long long nvlink_errors(const gpu_t *g, double t, unsigned link, unsigned id) {
    const scenario_t *s = find_scenario(g->index, "nvlinkerr");
    if (!s || t < s->at || link != 0)
        return 0;
    double since = t - s->at;
    switch (id) {
    case NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY: return (unsigned long long)(3.0 * since);
    case NVML_FI_DEV_NVLINK_ERROR_DL_CRC: return (unsigned long long)(10.0 * since);
    default: return (unsigned long long)(since / 20.0);
    }
}

static unsigned long long violation_ns(double seconds) {
    return (unsigned long long)(seconds * 1e9);
}

static int driver_before(int major, int minor) {
    return g_prof.driver_major < major ||
           (g_prof.driver_major == major && g_prof.driver_minor < minor);
}

/* First field id of the SW-thermal, HW-thermal, HW-power-brake time counters; 0: none. */
static unsigned throttle_counters_at(void) {
    if (driver_before(575, 0))
        return 0;
    return driver_before(580, 82) ? 251 : 269;
}

/* First field id of the power-smoothing block; 0: none. */
static unsigned smoothing_at(void) {
    if (driver_before(570, 0))
        return 0;
    if (driver_before(575, 0))
        return 251;
    return driver_before(580, 82) ? 256 : 251;
}

static int has_pcie_byte_counters(void) { return !driver_before(560, 0); }

/* Power smoothing as an administrator leaves it; the smoothing scenario changes it. Whether a
 * Hopper or Ampere part answers these is not known here: the fake answers them on every GPU so
 * that what each id means in each branch is exercised. */
static unsigned smoothing_value(const gpu_t *g, double t, unsigned offset) {
    int set = scenario_active(g->index, "smoothing", t);
    switch (offset) {
    case SMOOTHING_ENABLED: return set ? 1 : 0;
    case SMOOTHING_HW_CIRCUITRY_PERCENT_LIFETIME_REMAINING: return 100;
    case SMOOTHING_MAX_NUM_PRESET_PROFILES: return 5;
    case SMOOTHING_ACTIVE_PRESET_PROFILE: return set ? 2 : 0;
    case SMOOTHING_ADMIN_OVERRIDE_PERCENT_TMP_FLOOR: return set ? 35 : 0;
    case SMOOTHING_ADMIN_OVERRIDE_RAMP_UP_RATE: return set ? 250000 : 0; /* mW/s */
    default: return 0;
    }
}

/* Fill one field value; returns the entry's nvmlReturn. */
static nvmlReturn_t field_value(const gpu_t *g, double t, nvmlFieldValue_t *v) {
    integrals_t in;
    state_t s;
    ecc_t e;
    unsigned id = v->fieldId;
    for (int k = 0; k < g_prof.nmissing_fields; k++)
        if (g_prof.missing_fields[k] == id) {
            v->valueType = NVML_VALUE_TYPE_UNSIGNED_INT;
            return NVML_ERROR_NOT_SUPPORTED;
        }
    unsigned counters = throttle_counters_at(), smoothing = smoothing_at();
    if (counters && id >= counters && id < counters + COUNTERS) {
        v->valueType = NVML_VALUE_TYPE_UNSIGNED_LONG_LONG;
        integrals_at(g, t, &in);
        v->value.ullVal = id - counters == COUNTER_HW_THERMAL ? violation_ns(in.thermal_s) : 0;
        return NVML_SUCCESS;
    }
    if (smoothing && id >= smoothing && id < smoothing + SMOOTHING_FIELDS) {
        v->valueType = NVML_VALUE_TYPE_UNSIGNED_INT;
        v->value.uiVal = smoothing_value(g, t, id - smoothing);
        return NVML_SUCCESS;
    }
    v->valueType = NVML_VALUE_TYPE_UNSIGNED_INT;
    switch (id) {
    case NVML_FI_DEV_MEMORY_TEMP:
        state_at(g, t, &s);
        v->value.uiVal = (unsigned)lround(s.mem_temp_c);
        return NVML_SUCCESS;
    case NVML_FI_DEV_POWER_INSTANT:
        v->value.uiVal = (unsigned)lround(power_at(g, t) * 1000.0);
        return NVML_SUCCESS;
    case NVML_FI_DEV_POWER_AVERAGE: /* one-second average: the power half a second ago */
        v->value.uiVal = (unsigned)lround(power_at(g, t - 0.5) * 1000.0);
        return NVML_SUCCESS;
    case NVML_FI_DEV_POWER_CURRENT_LIMIT: v->value.uiVal = g->power_default_mw; return NVML_SUCCESS;
    case NVML_FI_DEV_TEMPERATURE_SHUTDOWN_TLIMIT:
        v->value.uiVal = g->temp_shutdown;
        return NVML_SUCCESS;
    case NVML_FI_DEV_TEMPERATURE_SLOWDOWN_TLIMIT:
        v->value.uiVal = g->temp_slowdown;
        return NVML_SUCCESS;
    case NVML_FI_DEV_NVLINK_LINK_COUNT:
        if (!g->nlinks)
            return NVML_ERROR_NOT_SUPPORTED;
        v->value.uiVal = (unsigned)g->nlinks;
        return NVML_SUCCESS;
    case NVML_FI_DEV_NVSWITCH_CONNECTED_LINK_COUNT:
        if (!g->nlinks)
            return NVML_ERROR_NOT_SUPPORTED;
        v->value.uiVal = 0;
        for (int l = 0; l < g->nlinks; l++)
            v->value.uiVal += g->links[l].remote_type == NVML_NVLINK_DEVICE_TYPE_SWITCH;
        return NVML_SUCCESS;
    case NVML_FI_DEV_NVLINK_GET_STATE: /* scoped by link, as nvmlDeviceGetNvLinkState */
        if (!g->nlinks)
            return NVML_ERROR_NOT_SUPPORTED;
        if (v->scopeId >= (unsigned)g->nlinks)
            return NVML_ERROR_INVALID_ARGUMENT;
        v->value.uiVal = 1;
        return NVML_SUCCESS;
    case NVML_FI_DEV_NVLINK_GET_VERSION: /* scoped by link, as nvmlDeviceGetNvLinkVersion */
        if (!g->nlinks)
            return NVML_ERROR_NOT_SUPPORTED;
        if (v->scopeId >= (unsigned)g->nlinks)
            return NVML_ERROR_INVALID_ARGUMENT;
        v->value.uiVal = g->nvlink_version;
        return NVML_SUCCESS;
    case NVML_FI_DEV_GET_GPU_RECOVERY_ACTION:
        if (driver_before(565, 0))
            break; /* an id this branch does not know */
        v->value.uiVal = g->recovery_action;
        return NVML_SUCCESS;
    case NVML_FI_DEV_PCIE_REPLAY_COUNTER: v->value.uiVal = 0; return NVML_SUCCESS;
    case NVML_FI_DEV_RETIRED_SBE:
    case NVML_FI_DEV_RETIRED_DBE:
    case NVML_FI_DEV_RETIRED_PENDING: {
        /* dynamic page retirement: before Ampere only; the retired scenario retires two
         * pages for single-bit and one for double-bit errors, the last waiting for a reset */
        if (g->arch >= NVML_DEVICE_ARCH_AMPERE)
            return NVML_ERROR_NOT_SUPPORTED;
        int retired = scenario_active(g->index, "retired", t);
        v->valueType = NVML_VALUE_TYPE_UNSIGNED_LONG_LONG;
        v->value.ullVal = !retired                         ? 0
                          : id == NVML_FI_DEV_RETIRED_SBE ? 2
                          : id == NVML_FI_DEV_RETIRED_DBE ? 1
                                                          : retirement_pending(g->index, t);
        return NVML_SUCCESS;
    }
    case NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY:
    case NVML_FI_DEV_NVLINK_ERROR_DL_RECOVERY:
    case NVML_FI_DEV_NVLINK_ERROR_DL_CRC: /* scoped by link; removed on Blackwell */
        if (!g->nlinks || g->arch >= NVML_DEVICE_ARCH_BLACKWELL)
            return NVML_ERROR_NOT_SUPPORTED;
        if (v->scopeId >= (unsigned)g->nlinks)
            return NVML_ERROR_INVALID_ARGUMENT;
        v->valueType = NVML_VALUE_TYPE_UNSIGNED_LONG_LONG;
        v->value.ullVal = nvlink_errors(g, t, v->scopeId, id);
        return NVML_SUCCESS;
    case NVML_FI_DEV_REMAPPED_COR:
    case NVML_FI_DEV_REMAPPED_UNC:
    case NVML_FI_DEV_REMAPPED_PENDING:
    case NVML_FI_DEV_REMAPPED_FAILURE:
        if (g->arch < NVML_DEVICE_ARCH_AMPERE)
            return NVML_ERROR_NOT_SUPPORTED;
        ecc_at(g, t, &e);
        /* 64 bits wide, as a real H200 on 580.159.04 answered */
        v->valueType = NVML_VALUE_TYPE_UNSIGNED_LONG_LONG;
        v->value.ullVal = id == NVML_FI_DEV_REMAPPED_COR       ? e.remap_cor
                          : id == NVML_FI_DEV_REMAPPED_UNC     ? e.remap_unc
                          : id == NVML_FI_DEV_REMAPPED_PENDING ? e.remap_pending
                                                               : e.remap_failure;
        return NVML_SUCCESS;
    default: break;
    }
    v->valueType = NVML_VALUE_TYPE_UNSIGNED_LONG_LONG;
    switch (id) {
    case NVML_FI_DEV_ECC_SBE_VOL_TOTAL:
    case NVML_FI_DEV_ECC_DBE_VOL_TOTAL:
    case NVML_FI_DEV_ECC_SBE_AGG_TOTAL:
    case NVML_FI_DEV_ECC_DBE_AGG_TOTAL:
        ecc_at(g, t, &e);
        v->value.ullVal = id == NVML_FI_DEV_ECC_SBE_VOL_TOTAL   ? e.sbe_vol
                          : id == NVML_FI_DEV_ECC_DBE_VOL_TOTAL ? e.dbe_vol
                          : id == NVML_FI_DEV_ECC_SBE_AGG_TOTAL ? e.sbe_agg
                                                                : e.dbe_agg;
        return NVML_SUCCESS;
    case NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION:
        integrals_at(g, t, &in);
        v->value.ullVal = (unsigned long long)energy_mj(g, t, &in);
        return NVML_SUCCESS;
    case NVML_FI_DEV_PCIE_COUNT_TX_BYTES:
    case NVML_FI_DEV_PCIE_COUNT_RX_BYTES:
        if (!has_pcie_byte_counters())
            break;
        /* 32 bits wide on real drivers ("can be wrapped") */
        integrals_at(g, t, &in);
        v->valueType = NVML_VALUE_TYPE_UNSIGNED_INT;
        v->value.uiVal = (unsigned)(unsigned long long)fmod(
            pcie_bytes(g, t, &in, id == NVML_FI_DEV_PCIE_COUNT_RX_BYTES), 4294967296.0);
        return NVML_SUCCESS;
    case NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX:
    case NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX: {
        int rx = id == NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX;
        if (!g->nlinks)
            return NVML_ERROR_NOT_SUPPORTED;
        integrals_at(g, t, &in);
        double bytes = 0.0;
        if (v->scopeId == 0xFFFFFFFFu) { /* UINT_MAX: all links */
            for (int l = 0; l < g->nlinks; l++)
                bytes += nvlink_bytes(g, &in, l, rx);
        } else if (v->scopeId < (unsigned)g->nlinks) {
            bytes = nvlink_bytes(g, &in, (int)v->scopeId, rx);
        } else {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        v->value.ullVal = (unsigned long long)(bytes / 1024.0); /* KiB */
        return NVML_SUCCESS;
    }
    case NVML_FI_DEV_PERF_POLICY_POWER:
        integrals_at(g, t, &in);
        v->value.ullVal = violation_ns(in.capped_s);
        return NVML_SUCCESS;
    case NVML_FI_DEV_PERF_POLICY_SYNC_BOOST: v->value.ullVal = 0; return NVML_SUCCESS;
    default: break;
    }
    /* a real driver leaves an unanswered entry typed as unsigned int (580.159.04, fields 91
     * and 251-253 on an H200) */
    v->valueType = NVML_VALUE_TYPE_UNSIGNED_INT;
    return NVML_ERROR_NOT_SUPPORTED; /* an id this branch does not know */
}

nvmlReturn_t nvmlDeviceGetFieldValues(nvmlDevice_t device, int valuesCount,
                                      nvmlFieldValue_t *values) {
    COUNT(nvmlDeviceGetFieldValues);
    OUT(values);
    DEVICE(device, 0);
    if (valuesCount <= 0)
        return NVML_ERROR_INVALID_ARGUMENT;
    double t = sim_time();
    long long now = realtime_us();
    for (int i = 0; i < valuesCount; i++) {
        nvmlFieldValue_t *v = &values[i];
        memset(&v->value, 0, sizeof v->value);
        v->nvmlReturn = field_value(g, t, v);
        v->timestamp = now;
        v->latencyUsec = 0;
    }
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t *utilization) {
    COUNT(nvmlDeviceGetUtilizationRates);
    OUT(utilization);
    DEVICE(device, 0);
    if (mig_enabled(g))
        return NVML_ERROR_NOT_SUPPORTED; /* no utilization while MIG is on */
    double u = gpu_load(g, sim_time());
    utilization->gpu = (unsigned)lround(u * 100.0);
    utilization->memory = (unsigned)lround(u * 60.0);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetEncoderUtilization(nvmlDevice_t device, unsigned int *utilization,
                                             unsigned int *samplingPeriodUs) {
    COUNT(nvmlDeviceGetEncoderUtilization);
    OUT(utilization && samplingPeriodUs);
    DEVICE(device, 0);
    *utilization = 0;
    *samplingPeriodUs = 167000;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetDecoderUtilization(nvmlDevice_t device, unsigned int *utilization,
                                             unsigned int *samplingPeriodUs) {
    COUNT(nvmlDeviceGetDecoderUtilization);
    OUT(utilization && samplingPeriodUs);
    DEVICE(device, 0);
    *utilization = 0;
    *samplingPeriodUs = 167000;
    return NVML_SUCCESS;
}

static void memory_of(const gpu_t *g, int slot, double t, unsigned long long *total,
                      unsigned long long *reserved, unsigned long long *used) {
    *total = slot_total(g, slot);
    *reserved = slot < 0 ? reserved_bytes(g) : 0;
    *used = slot_used(g, slot, t);
}

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory) {
    COUNT(nvmlDeviceGetMemoryInfo);
    OUT(memory);
    DEVICE(device, ALLOW_MIG);
    if (parent_denied(g, slot))
        return NVML_ERROR_NO_PERMISSION;
    unsigned long long total, reserved, used;
    memory_of(g, slot, sim_time(), &total, &reserved, &used);
    memory->total = total;
    memory->used = used + reserved; /* v1 counts the driver's reservation as used */
    memory->free = total - memory->used;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory) {
    COUNT(nvmlDeviceGetMemoryInfo_v2);
    OUT(memory);
    DEVICE(device, ALLOW_MIG);
    if (parent_denied(g, slot))
        return NVML_ERROR_NO_PERMISSION;
    nvmlReturn_t broken = fault(g, FN_nvmlDeviceGetMemoryInfo_v2, -1);
    if (slot < 0 && broken != NVML_SUCCESS)
        return broken;
    if (memory->version != nvmlMemory_v2)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    unsigned long long total, reserved, used;
    memory_of(g, slot, sim_time(), &total, &reserved, &used);
    memory->total = total;
    memory->reserved = reserved;
    memory->used = used;
    memory->free = total - reserved - used;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetBAR1MemoryInfo(nvmlDevice_t device, nvmlBAR1Memory_t *bar1Memory) {
    COUNT(nvmlDeviceGetBAR1MemoryInfo);
    OUT(bar1Memory);
    DEVICE(device, ALLOW_MIG);
    /* Datacenter parts map the whole framebuffer plus a little (H100 80GB: 128 GiB BAR1). */
    unsigned long long total = g->memory_total > (64ULL << 30) ? (128ULL << 30) : (64ULL << 30);
    bar1Memory->bar1Total = total;
    bar1Memory->bar1Used = 32ULL << 20;
    bar1Memory->bar1Free = total - bar1Memory->bar1Used;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t device, unsigned int sensorType,
                                      unsigned int *temp) {
    COUNT(nvmlDeviceGetTemperature);
    OUT(temp);
    DEVICE(device, 0);
    if (sensorType != NVML_TEMPERATURE_GPU)
        return NVML_ERROR_INVALID_ARGUMENT;
    state_t s;
    state_at(g, sim_time(), &s);
    *temp = (unsigned)lround(s.temp_c);
    return NVML_SUCCESS;
}

#if FAKE_NVML_BRANCH >= 560
nvmlReturn_t nvmlDeviceGetTemperatureV(nvmlDevice_t device, nvmlTemperature_t *temperature) {
    COUNT(nvmlDeviceGetTemperatureV);
    OUT(temperature);
    DEVICE(device, 0);
    if (temperature->version != nvmlTemperature_v1)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    if (temperature->sensorType != NVML_TEMPERATURE_GPU)
        return NVML_ERROR_INVALID_ARGUMENT;
    state_t s;
    state_at(g, sim_time(), &s);
    temperature->temperature = (int)lround(s.temp_c);
    return NVML_SUCCESS;
}
#endif

nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t device, unsigned int *power) {
    COUNT(nvmlDeviceGetPowerUsage);
    OUT(power);
    DEVICE(device, 0);
    *power = (unsigned)lround(power_at(g, sim_time()) * 1000.0);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetTotalEnergyConsumption(nvmlDevice_t device,
                                                 unsigned long long *energy) {
    COUNT(nvmlDeviceGetTotalEnergyConsumption);
    OUT(energy);
    DEVICE(device, 0);
    double t = sim_time();
    integrals_t in;
    integrals_at(g, t, &in);
    *energy = (unsigned long long)energy_mj(g, t, &in);
    return NVML_SUCCESS;
}

static nvmlReturn_t current_clock(const gpu_t *g, unsigned type, unsigned *clock) {
    state_t s;
    state_at(g, sim_time(), &s);
    switch (type) {
    case NVML_CLOCK_GRAPHICS:
    case NVML_CLOCK_SM: *clock = s.sm_clock; return NVML_SUCCESS;
    case NVML_CLOCK_MEM: *clock = g->clock_mem_max; return NVML_SUCCESS;
    case NVML_CLOCK_VIDEO:
        *clock = (unsigned)((double)g->clock_video_max * s.sm_clock / g->clock_sm_max);
        return NVML_SUCCESS;
    default: return NVML_ERROR_INVALID_ARGUMENT;
    }
}

nvmlReturn_t nvmlDeviceGetClockInfo(nvmlDevice_t device, unsigned int type, unsigned int *clock) {
    COUNT(nvmlDeviceGetClockInfo);
    OUT(clock);
    DEVICE(device, 0);
    return current_clock(g, type, clock);
}

nvmlReturn_t nvmlDeviceGetClock(nvmlDevice_t device, unsigned int clockType, unsigned int clockId,
                                unsigned int *clockMHz) {
    COUNT(nvmlDeviceGetClock);
    OUT(clockMHz);
    DEVICE(device, 0);
    if (clockId == NVML_CLOCK_ID_CURRENT)
        return current_clock(g, clockType, clockMHz);
    if (clockId > NVML_CLOCK_ID_CUSTOMER_BOOST_MAX || clockType > NVML_CLOCK_VIDEO)
        return NVML_ERROR_INVALID_ARGUMENT;
    *clockMHz = clockType == NVML_CLOCK_MEM     ? g->clock_mem_max
                : clockType == NVML_CLOCK_VIDEO ? g->clock_video_max
                                                : g->clock_sm_max;
    return NVML_SUCCESS;
}

static nvmlReturn_t pstate(nvmlDevice_t device, unsigned int *state) {
    OUT(state);
    DEVICE(device, 0);
    *state = 0; /* datacenter GPUs in persistence mode stay in P0 */
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetPerformanceState(nvmlDevice_t device, unsigned int *pState) {
    COUNT(nvmlDeviceGetPerformanceState);
    return pstate(device, pState);
}

nvmlReturn_t nvmlDeviceGetPowerState(nvmlDevice_t device, unsigned int *pState) {
    COUNT(nvmlDeviceGetPowerState);
    return pstate(device, pState);
}

static nvmlReturn_t event_reasons(nvmlDevice_t device, unsigned long long *reasons) {
    OUT(reasons);
    DEVICE(device, 0);
    state_t s;
    state_at(g, sim_time(), &s);
    *reasons = s.reasons;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetCurrentClocksEventReasons(nvmlDevice_t device,
                                                    unsigned long long *clocksEventReasons) {
    COUNT(nvmlDeviceGetCurrentClocksEventReasons);
    return event_reasons(device, clocksEventReasons);
}

nvmlReturn_t nvmlDeviceGetCurrentClocksThrottleReasons(nvmlDevice_t device,
                                                       unsigned long long *clocksThrottleReasons) {
    COUNT(nvmlDeviceGetCurrentClocksThrottleReasons);
    return event_reasons(device, clocksThrottleReasons);
}

static nvmlReturn_t supported_reasons(nvmlDevice_t device, unsigned long long *reasons) {
    OUT(reasons);
    DEVICE(device, 0);
    *reasons = nvmlClocksEventReasonSupported;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetSupportedClocksEventReasons(nvmlDevice_t device,
                                                      unsigned long long *supportedReasons) {
    COUNT(nvmlDeviceGetSupportedClocksEventReasons);
    return supported_reasons(device, supportedReasons);
}

nvmlReturn_t nvmlDeviceGetSupportedClocksThrottleReasons(nvmlDevice_t device,
                                                         unsigned long long *supportedReasons) {
    COUNT(nvmlDeviceGetSupportedClocksThrottleReasons);
    return supported_reasons(device, supportedReasons);
}

nvmlReturn_t nvmlDeviceGetCurrPcieLinkGeneration(nvmlDevice_t device, unsigned int *currLinkGen) {
    COUNT(nvmlDeviceGetCurrPcieLinkGeneration);
    OUT(currLinkGen);
    DEVICE(device, 0);
    state_t s;
    state_at(g, sim_time(), &s);
    *currLinkGen = s.idle ? 1 : g->pcie_gen_max; /* the link trains down when idle */
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetCurrPcieLinkWidth(nvmlDevice_t device, unsigned int *currLinkWidth) {
    COUNT(nvmlDeviceGetCurrPcieLinkWidth);
    OUT(currLinkWidth);
    DEVICE(device, 0);
    *currLinkWidth = g->pcie_width_max;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetPcieThroughput(nvmlDevice_t device, unsigned int counter,
                                         unsigned int *value) {
    COUNT(nvmlDeviceGetPcieThroughput);
    OUT(value);
    DEVICE(device, 0);
    if (counter > NVML_PCIE_UTIL_RX_BYTES)
        return NVML_ERROR_INVALID_ARGUMENT;
    double u = gpu_load(g, sim_time());
    *value = (unsigned)(pcie_rate(g, u, counter == NVML_PCIE_UTIL_RX_BYTES) / 1024.0); /* KB/s */
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetPcieReplayCounter(nvmlDevice_t device, unsigned int *value) {
    COUNT(nvmlDeviceGetPcieReplayCounter);
    OUT(value);
    DEVICE(device, 0);
    *value = 0;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t device, unsigned int errorType,
                                         unsigned int counterType,
                                         unsigned long long *eccCounts) {
    COUNT(nvmlDeviceGetTotalEccErrors);
    OUT(eccCounts);
    DEVICE(device, 0);
    if (errorType > NVML_MEMORY_ERROR_TYPE_UNCORRECTED || counterType > NVML_AGGREGATE_ECC)
        return NVML_ERROR_INVALID_ARGUMENT;
    ecc_t e;
    ecc_at(g, sim_time(), &e);
    if (errorType == NVML_MEMORY_ERROR_TYPE_CORRECTED)
        *eccCounts = counterType == NVML_VOLATILE_ECC ? e.sbe_vol : e.sbe_agg;
    else
        *eccCounts = counterType == NVML_VOLATILE_ECC ? e.dbe_vol : e.dbe_agg;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetEccMode(nvmlDevice_t device, unsigned int *current,
                                  unsigned int *pending) {
    COUNT(nvmlDeviceGetEccMode);
    OUT(current && pending);
    DEVICE(device, 0);
    *current = 1;
    *pending = 1;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetRemappedRows(nvmlDevice_t device, unsigned int *corrRows,
                                       unsigned int *uncRows, unsigned int *isPending,
                                       unsigned int *failureOccurred) {
    COUNT(nvmlDeviceGetRemappedRows);
    OUT(corrRows && uncRows && isPending && failureOccurred);
    DEVICE(device, 0);
    if (g->arch < NVML_DEVICE_ARCH_AMPERE)
        return NVML_ERROR_NOT_SUPPORTED;
    if (mig_enabled(g) && g->n_mig > 0)
        return NVML_ERROR_NOT_SUPPORTED; /* not while MIG instances exist */
    ecc_t e;
    ecc_at(g, sim_time(), &e);
    *corrRows = e.remap_cor;
    *uncRows = e.remap_unc;
    *isPending = e.remap_pending;
    *failureOccurred = e.remap_failure;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetRetiredPages(nvmlDevice_t device, unsigned int cause,
                                       unsigned int *pageCount, unsigned long long *addresses) {
    COUNT(nvmlDeviceGetRetiredPages);
    OUT(pageCount);
    DEVICE(device, 0);
    if (g->arch >= NVML_DEVICE_ARCH_AMPERE)
        return NVML_ERROR_NOT_SUPPORTED; /* Ampere and newer remap rows instead */
    /* the retired scenario, as fields 29 and 30 count it: cause 0 (multiple single-bit
     * errors) two pages, cause 1 (a double-bit error) one */
    unsigned count = 0;
    if (scenario_active(g->index, "retired", sim_time()))
        count = cause == 0 ? 2 : cause == 1 ? 1 : 0;
    unsigned room = *pageCount;
    *pageCount = count;
    if (room < count)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    for (unsigned k = 0; k < count && addresses; k++)
        addresses[k] = 0x1c0000ull + 0x1000ull * (cause * 8 + k); /* page addresses */
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetRetiredPagesPendingStatus(nvmlDevice_t device, unsigned int *isPending) {
    COUNT(nvmlDeviceGetRetiredPagesPendingStatus);
    OUT(isPending);
    DEVICE(device, 0);
    if (g->arch >= NVML_DEVICE_ARCH_AMPERE)
        return NVML_ERROR_NOT_SUPPORTED;
    *isPending = (unsigned)retirement_pending(g->index, sim_time());
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetFanSpeed(nvmlDevice_t device, unsigned int *speed) {
    COUNT(nvmlDeviceGetFanSpeed);
    OUT(speed);
    DEVICE(device, 0);
    if (!g->fans)
        return NVML_ERROR_NOT_SUPPORTED;
    *speed = 30 + (unsigned)lround(40.0 * gpu_load(g, sim_time() - 5.0));
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetFanSpeed_v2(nvmlDevice_t device, unsigned int fan, unsigned int *speed) {
    COUNT(nvmlDeviceGetFanSpeed_v2);
    OUT(speed);
    DEVICE(device, 0);
    if (!g->fans)
        return NVML_ERROR_NOT_SUPPORTED;
    if (fan >= g->fans)
        return NVML_ERROR_INVALID_ARGUMENT;
    *speed = 30 + (unsigned)lround(40.0 * gpu_load(g, sim_time() - 5.0));
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetNumFans(nvmlDevice_t device, unsigned int *numFans) {
    COUNT(nvmlDeviceGetNumFans);
    OUT(numFans);
    DEVICE(device, 0);
    if (!g->fans)
        return NVML_ERROR_NOT_SUPPORTED;
    *numFans = g->fans;
    return NVML_SUCCESS;
}

/* ------------------------------------------------------------------------------------------ */
/* Processes                                                                                  */
/* ------------------------------------------------------------------------------------------ */

static int proc_slot(const gpu_t *g, const proc_t *p) {
    for (int k = 0; k < g->n_mig; k++)
        if ((int)g->mig[k].gi_id == p->gi_id)
            return k;
    return -1;
}

/* NVML's two-call protocol: too small a buffer gets INSUFFICIENT_SIZE and the count needed. */
static nvmlReturn_t compute_processes(nvmlDevice_t device, unsigned int *infoCount,
                                      nvmlProcessInfo_t *infos) {
    OUT(infoCount);
    DEVICE(device, ALLOW_MIG);
    if (parent_denied(g, slot))
        return NVML_ERROR_NO_PERMISSION;
    double t = sim_time();
    int mig = mig_enabled(g);
    nvmlProcessInfo_t found[MAX_PROCS];
    unsigned n = 0;
    for (int i = 0; i < g->nprocs; i++) {
        const proc_t *p = &g->procs[i];
        int pslot = mig ? proc_slot(g, p) : -1;
        if (mig && pslot < 0)
            continue; /* its GPU instance does not exist */
        if (slot >= 0 && pslot != slot)
            continue; /* a MIG handle lists only its own instance's processes */
        /* share of the memory its slot uses */
        double share_sum = 0.0;
        for (int k = 0; k < g->nprocs; k++)
            if (!mig || g->procs[k].gi_id == p->gi_id)
                share_sum += g->procs[k].share;
        unsigned long long used = slot_used(g, pslot, t);
        found[n].pid = p->pid;
        found[n].usedGpuMemory =
            (unsigned long long)(used * (share_sum > 0 ? p->share / share_sum : 0.0)) /
            (1024 * 1024) * (1024 * 1024);
        found[n].gpuInstanceId = mig ? (unsigned)p->gi_id : NVML_VALUE_NOT_AVAILABLE_UINT;
        found[n].computeInstanceId = mig ? 0 : NVML_VALUE_NOT_AVAILABLE_UINT;
        n++;
    }
    if (*infoCount < n) {
        *infoCount = n;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    if (n && !infos)
        return NVML_ERROR_INVALID_ARGUMENT;
    memcpy(infos, found, n * sizeof found[0]);
    *infoCount = n;
    return NVML_SUCCESS;
}

static nvmlReturn_t no_processes(nvmlDevice_t device, unsigned int *infoCount) {
    OUT(infoCount);
    DEVICE(device, ALLOW_MIG);
    if (parent_denied(g, slot))
        return NVML_ERROR_NO_PERMISSION;
    *infoCount = 0;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t device, unsigned int *infoCount,
                                                     nvmlProcessInfo_t *infos) {
    COUNT(nvmlDeviceGetComputeRunningProcesses_v2);
    return compute_processes(device, infoCount, infos);
}

nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device, unsigned int *infoCount,
                                                     nvmlProcessInfo_t *infos) {
    COUNT(nvmlDeviceGetComputeRunningProcesses_v3);
    if (check_device(device, ALLOW_MIG) == NVML_SUCCESS) {
        nvmlReturn_t broken =
            fault(&g_prof.gpus[device->gpu], FN_nvmlDeviceGetComputeRunningProcesses_v3, -1);
        if (broken != NVML_SUCCESS)
            return broken;
    }
    return compute_processes(device, infoCount, infos);
}

nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v2(nvmlDevice_t device,
                                                      unsigned int *infoCount,
                                                      nvmlProcessInfo_t *infos) {
    COUNT(nvmlDeviceGetGraphicsRunningProcesses_v2);
    (void)infos;
    return no_processes(device, infoCount);
}

nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v3(nvmlDevice_t device,
                                                      unsigned int *infoCount,
                                                      nvmlProcessInfo_t *infos) {
    COUNT(nvmlDeviceGetGraphicsRunningProcesses_v3);
    (void)infos;
    return no_processes(device, infoCount);
}

nvmlReturn_t nvmlDeviceGetMPSComputeRunningProcesses_v2(nvmlDevice_t device,
                                                        unsigned int *infoCount,
                                                        nvmlProcessInfo_t *infos) {
    COUNT(nvmlDeviceGetMPSComputeRunningProcesses_v2);
    (void)infos;
    return no_processes(device, infoCount);
}

nvmlReturn_t nvmlDeviceGetMPSComputeRunningProcesses_v3(nvmlDevice_t device,
                                                        unsigned int *infoCount,
                                                        nvmlProcessInfo_t *infos) {
    COUNT(nvmlDeviceGetMPSComputeRunningProcesses_v3);
    (void)infos;
    return no_processes(device, infoCount);
}

nvmlReturn_t nvmlDeviceGetProcessUtilization(nvmlDevice_t device,
                                             nvmlProcessUtilizationSample_t *utilization,
                                             unsigned int *processSamplesCount,
                                             unsigned long long lastSeenTimeStamp) {
    COUNT(nvmlDeviceGetProcessUtilization);
    OUT(processSamplesCount);
    DEVICE(device, 0);
    if (mig_enabled(g))
        return NVML_ERROR_NOT_SUPPORTED; /* no per-process utilization under MIG */
    long long now = realtime_us();
    unsigned n = (unsigned)g->nprocs;
    if (n == 0 || lastSeenTimeStamp >= (unsigned long long)now)
        return NVML_ERROR_NOT_FOUND; /* no samples newer than lastSeenTimeStamp */
    if (!utilization || *processSamplesCount < n) {
        *processSamplesCount = n;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    double u = gpu_load(g, sim_time()), share_sum = 0.0;
    for (unsigned i = 0; i < n; i++)
        share_sum += g->procs[i].share;
    for (unsigned i = 0; i < n; i++) {
        double f = share_sum > 0 ? g->procs[i].share / share_sum : 0.0;
        utilization[i].pid = g->procs[i].pid;
        utilization[i].timeStamp = (unsigned long long)now;
        utilization[i].smUtil = (unsigned)lround(100.0 * u * f);
        utilization[i].memUtil = (unsigned)lround(60.0 * u * f);
        utilization[i].encUtil = 0;
        utilization[i].decUtil = 0;
    }
    *processSamplesCount = n;
    return NVML_SUCCESS;
}

/* The driver model (WDDM/TCC) is a Windows notion: Linux drivers answer NOT_SUPPORTED. */
static nvmlReturn_t driver_model(nvmlDevice_t device, unsigned int *current,
                                 unsigned int *pending) {
    OUT(current && pending);
    DEVICE(device, 0);
    return NVML_ERROR_NOT_SUPPORTED;
}

nvmlReturn_t nvmlDeviceGetDriverModel(nvmlDevice_t device, unsigned int *current,
                                      unsigned int *pending) {
    COUNT(nvmlDeviceGetDriverModel);
    return driver_model(device, current, pending);
}

nvmlReturn_t nvmlDeviceGetDriverModel_v2(nvmlDevice_t device, unsigned int *current,
                                         unsigned int *pending) {
    COUNT(nvmlDeviceGetDriverModel_v2);
    return driver_model(device, current, pending);
}

/* ------------------------------------------------------------------------------------------ */
/* Fabric and NVLink                                                                          */
/* ------------------------------------------------------------------------------------------ */

nvmlReturn_t nvmlDeviceGetGpuFabricInfo(nvmlDevice_t device, nvmlGpuFabricInfo_t *gpuFabricInfo) {
    COUNT(nvmlDeviceGetGpuFabricInfo);
    OUT(gpuFabricInfo);
    DEVICE(device, 0);
    if (!g->fabric)
        return NVML_ERROR_NOT_SUPPORTED;
    memset(gpuFabricInfo, 0, sizeof(*gpuFabricInfo));
    gpuFabricInfo->status = g->fabric_status;
    gpuFabricInfo->state = g->fabric_state;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetGpuFabricInfoV(nvmlDevice_t device, nvmlGpuFabricInfoV_t *info) {
    COUNT(nvmlDeviceGetGpuFabricInfoV);
    OUT(info);
    DEVICE(device, 0);
    if (info->version != nvmlGpuFabricInfo_v2 && info->version != nvmlGpuFabricInfo_v3)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    if (!g->fabric)
        return NVML_ERROR_NOT_SUPPORTED;
    memset(info->clusterUuid, 0, sizeof info->clusterUuid);
    info->status = g->fabric_status;
    info->cliqueId = 0;
    info->state = g->fabric_state;
    info->healthMask = 0;
    if (info->version == nvmlGpuFabricInfo_v3)
        info->healthSummary = NVML_GPU_FABRIC_HEALTH_SUMMARY_HEALTHY;
    return NVML_SUCCESS;
}

/* Declares `l`, the link, after checking it exists. */
#define LINK(g, link)                                                                              \
    if (!(g)->nlinks)                                                                              \
        return NVML_ERROR_NOT_SUPPORTED;                                                           \
    if ((link) >= (unsigned)(g)->nlinks)                                                           \
        return NVML_ERROR_INVALID_ARGUMENT;                                                        \
    const nvlink_t *l = &(g)->links[(link)];                                                       \
    (void)l

nvmlReturn_t nvmlDeviceGetNvLinkState(nvmlDevice_t device, unsigned int link,
                                      unsigned int *isActive) {
    COUNT(nvmlDeviceGetNvLinkState);
    OUT(isActive);
    DEVICE(device, 0);
    LINK(g, link);
    *isActive = 1;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetNvLinkVersion(nvmlDevice_t device, unsigned int link,
                                        unsigned int *version) {
    COUNT(nvmlDeviceGetNvLinkVersion);
    OUT(version);
    DEVICE(device, 0);
    LINK(g, link);
    *version = g->nvlink_version;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetNvLinkCapability(nvmlDevice_t device, unsigned int link,
                                           unsigned int capability, unsigned int *capResult) {
    COUNT(nvmlDeviceGetNvLinkCapability);
    OUT(capResult);
    DEVICE(device, 0);
    LINK(g, link);
    switch (capability) {
    case 0: /* P2P_SUPPORTED */
    case 2: /* P2P_ATOMICS */
    case 5: /* VALID */ *capResult = 1; return NVML_SUCCESS;
    case 1: /* SYSMEM_ACCESS */
    case 3: /* SYSMEM_ATOMICS */
    case 4: /* SLI_BRIDGE */ *capResult = 0; return NVML_SUCCESS;
    default: return NVML_ERROR_INVALID_ARGUMENT;
    }
}

nvmlReturn_t nvmlDeviceGetNvLinkRemotePciInfo_v2(nvmlDevice_t device, unsigned int link,
                                                 nvmlPciInfo_t *pci) {
    COUNT(nvmlDeviceGetNvLinkRemotePciInfo_v2);
    OUT(pci);
    DEVICE(device, 0);
    LINK(g, link);
    unsigned d, b, dv, fn;
    parse_bus_id(l->bus_id, &d, &b, &dv, &fn);
    fill_pci(pci, d, b, dv, fn, l->remote_pci_device_id, 0);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetNvLinkRemoteDeviceType(nvmlDevice_t device, unsigned int link,
                                                 unsigned int *pNvLinkDeviceType) {
    COUNT(nvmlDeviceGetNvLinkRemoteDeviceType);
    OUT(pNvLinkDeviceType);
    DEVICE(device, 0);
    LINK(g, link);
    *pNvLinkDeviceType = l->remote_type;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetNvLinkErrorCounter(nvmlDevice_t device, unsigned int link,
                                             unsigned int counter,
                                             unsigned long long *counterValue) {
    COUNT(nvmlDeviceGetNvLinkErrorCounter);
    OUT(counterValue);
    DEVICE(device, 0);
    LINK(g, link);
    if (counter > 4) /* DL_REPLAY .. DL_ECC_DATA */
        return NVML_ERROR_INVALID_ARGUMENT;
    *counterValue = 0;
    return NVML_SUCCESS;
}

/* ------------------------------------------------------------------------------------------ */
/* MIG                                                                                        */
/* ------------------------------------------------------------------------------------------ */

nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t device, unsigned int *currentMode,
                                  unsigned int *pendingMode) {
    COUNT(nvmlDeviceGetMigMode);
    OUT(currentMode && pendingMode);
    DEVICE(device, 0);
    if (!g->n_mig_profiles)
        return NVML_ERROR_NOT_SUPPORTED;
    *currentMode = *pendingMode = mig_enabled(g) ? 1 : 0;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t device, unsigned int *count) {
    COUNT(nvmlDeviceGetMaxMigDeviceCount);
    OUT(count);
    DEVICE(device, 0);
    if (!g->n_mig_profiles)
        return NVML_ERROR_NOT_SUPPORTED;
    *count = total_slices(g);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t device, unsigned int index,
                                                 nvmlDevice_t *migDevice) {
    COUNT(nvmlDeviceGetMigDeviceHandleByIndex);
    OUT(migDevice);
    DEVICE(device, 0);
    if (!g->n_mig_profiles)
        return NVML_ERROR_NOT_SUPPORTED;
    if (index >= total_slices(g))
        return NVML_ERROR_INVALID_ARGUMENT;
    if (!mig_enabled(g) || index >= (unsigned)g->n_mig)
        return NVML_ERROR_NOT_FOUND; /* an empty slot */
    *migDevice = &g_mig_devices[g->index][index];
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceIsMigDeviceHandle(nvmlDevice_t device, unsigned int *isMigDevice) {
    COUNT(nvmlDeviceIsMigDeviceHandle);
    OUT(isMigDevice);
    DEVICE(device, IDENTITY | ALLOW_MIG);
    *isMigDevice = slot >= 0;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetGpuInstanceId(nvmlDevice_t device, unsigned int *id) {
    COUNT(nvmlDeviceGetGpuInstanceId);
    OUT(id);
    DEVICE(device, IDENTITY | ALLOW_MIG);
    if (slot < 0)
        return NVML_ERROR_NOT_SUPPORTED;
    nvmlReturn_t broken = fault(g, FN_nvmlDeviceGetGpuInstanceId, (int)g->mig[slot].gi_id);
    if (broken != NVML_SUCCESS)
        return broken;
    *id = g->mig[slot].gi_id;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetComputeInstanceId(nvmlDevice_t device, unsigned int *id) {
    COUNT(nvmlDeviceGetComputeInstanceId);
    OUT(id);
    DEVICE(device, IDENTITY | ALLOW_MIG);
    if (slot < 0)
        return NVML_ERROR_NOT_SUPPORTED;
    *id = 0; /* one compute instance spanning each GPU instance */
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetDeviceHandleFromMigDeviceHandle(nvmlDevice_t migDevice,
                                                          nvmlDevice_t *device) {
    COUNT(nvmlDeviceGetDeviceHandleFromMigDeviceHandle);
    OUT(device);
    nvmlDevice_t d = migDevice;
    DEVICE(d, IDENTITY | ALLOW_MIG);
    if (slot < 0)
        return NVML_ERROR_INVALID_ARGUMENT;
    *device = &g_devices[g->index];
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetGpuInstanceById(nvmlDevice_t device, unsigned int id,
                                          nvmlGpuInstance_t *gpuInstance) {
    COUNT(nvmlDeviceGetGpuInstanceById);
    OUT(gpuInstance);
    DEVICE(device, 0);
    if (!g_prof.privileged)
        return NVML_ERROR_NO_PERMISSION; /* "requires privileged user" */
    if (!g->n_mig_profiles || !mig_enabled(g))
        return NVML_ERROR_NOT_SUPPORTED;
    for (int k = 0; k < g->n_mig; k++) {
        if (g->mig[k].gi_id == id) {
            *gpuInstance = &g_gpu_instances[g->index][k];
            return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_NOT_FOUND;
}

nvmlReturn_t nvmlGpuInstanceGetInfo(nvmlGpuInstance_t gpuInstance, nvmlGpuInstanceInfo_t *info) {
    COUNT(nvmlGpuInstanceGetInfo);
    OUT(info);
    INITIALIZED();
    if (!gpuInstance || gpuInstance->magic != GI_MAGIC || gpuInstance->gpu < 0 ||
        gpuInstance->gpu >= g_prof.ngpus)
        return NVML_ERROR_INVALID_ARGUMENT;
    const gpu_t *g = &g_prof.gpus[gpuInstance->gpu];
    if (!mig_enabled(g) || gpuInstance->slot >= g->n_mig)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (gpu_lost(g->index, sim_time()))
        return NVML_ERROR_GPU_IS_LOST;
    const mig_instance_t *m = &g->mig[gpuInstance->slot];
    info->device = &g_devices[g->index];
    info->id = m->gi_id;
    info->profileId = g->mig_profiles[m->profile].profile_id;
    info->placement.start = m->start;
    info->placement.size = m->size;
    return NVML_SUCCESS;
}

static const mig_profile_t *profile_by_index(const gpu_t *g, unsigned index) {
    for (int i = 0; i < g->n_mig_profiles; i++)
        if (g->mig_profiles[i].index == index)
            return &g->mig_profiles[i];
    return NULL;
}

static void fill_profile_info(const gpu_t *g, const mig_profile_t *p,
                              nvmlGpuInstanceProfileInfo_t *info) {
    memset(info, 0, sizeof(*info));
    info->id = p->profile_id;
    info->isP2pSupported = 0;
    info->sliceCount = p->slices;
    info->instanceCount = p->max_instances;
    info->multiprocessorCount = p->sm_count;
    info->copyEngineCount = p->slices;
    info->decoderCount = p->slices == total_slices(g) ? (g->arch >= 9 ? 7 : 5) : p->slices / 2;
    info->encoderCount = 0;
    info->jpegCount = p->slices == total_slices(g) ? 1 : 0;
    info->ofaCount = p->slices == total_slices(g) ? 1 : 0;
    info->memorySizeMB = p->mem_mb;
}

nvmlReturn_t nvmlDeviceGetGpuInstanceProfileInfo(nvmlDevice_t device, unsigned int profile,
                                                 nvmlGpuInstanceProfileInfo_t *info) {
    COUNT(nvmlDeviceGetGpuInstanceProfileInfo);
    OUT(info);
    DEVICE(device, 0);
    const mig_profile_t *p = profile_by_index(g, profile);
    if (!p)
        return NVML_ERROR_NOT_SUPPORTED;
    fill_profile_info(g, p, info);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetGpuInstanceProfileInfoV(nvmlDevice_t device, unsigned int profile,
                                                  nvmlGpuInstanceProfileInfo_v2_t *info) {
    COUNT(nvmlDeviceGetGpuInstanceProfileInfoV);
    OUT(info);
    DEVICE(device, 0);
    if (info->version != nvmlGpuInstanceProfileInfo_v2)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    const mig_profile_t *p = profile_by_index(g, profile);
    if (!p)
        return NVML_ERROR_NOT_SUPPORTED;
    nvmlGpuInstanceProfileInfo_t v1;
    fill_profile_info(g, p, &v1);
    info->id = v1.id;
    info->isP2pSupported = v1.isP2pSupported;
    info->sliceCount = v1.sliceCount;
    info->instanceCount = v1.instanceCount;
    info->multiprocessorCount = v1.multiprocessorCount;
    info->copyEngineCount = v1.copyEngineCount;
    info->decoderCount = v1.decoderCount;
    info->encoderCount = v1.encoderCount;
    info->jpegCount = v1.jpegCount;
    info->ofaCount = v1.ofaCount;
    info->memorySizeMB = v1.memorySizeMB;
    snprintf(info->name, sizeof info->name, "MIG %s", p->name);
    return NVML_SUCCESS;
}

/* ------------------------------------------------------------------------------------------ */
/* GPM (Hopper and newer)                                                                     */
/* ------------------------------------------------------------------------------------------ */

struct nvmlGpmSample_st {
    unsigned magic;
    int taken;
    int gpu;
    int slot; /* -1 = whole GPU, else MIG slot */
    double t;
    integrals_t in;
};

nvmlReturn_t nvmlGpmQueryDeviceSupport(nvmlDevice_t device, nvmlGpmSupport_t *gpmSupport) {
    COUNT(nvmlGpmQueryDeviceSupport);
    OUT(gpmSupport);
    DEVICE(device, 0);
    if (gpmSupport->version != NVML_GPM_SUPPORT_VERSION)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    gpmSupport->isSupportedDevice = g->gpm ? 1 : 0; /* the way callers ask: success + 0 */
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlGpmSampleAlloc(nvmlGpmSample_t *gpmSample) {
    COUNT(nvmlGpmSampleAlloc);
    OUT(gpmSample);
    INITIALIZED();
    struct nvmlGpmSample_st *s = calloc(1, sizeof(*s));
    if (!s)
        return NVML_ERROR_MEMORY;
    s->magic = GPM_MAGIC;
    *gpmSample = s;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlGpmSampleFree(nvmlGpmSample_t gpmSample) {
    COUNT(nvmlGpmSampleFree);
    INITIALIZED();
    if (!gpmSample || gpmSample->magic != GPM_MAGIC)
        return NVML_ERROR_INVALID_ARGUMENT;
    gpmSample->magic = 0;
    free(gpmSample);
    return NVML_SUCCESS;
}

static nvmlReturn_t take_sample(gpu_t *g, int slot, nvmlGpmSample_t s) {
    if (!s || s->magic != GPM_MAGIC)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (!g->gpm)
        return NVML_ERROR_NOT_SUPPORTED;
    if (!g_prof.privileged && g_prof.profiling_admin_only)
        return NVML_ERROR_NO_PERMISSION; /* profiling is admin-only (RmProfilingAdminOnly=1) */
    s->taken = 1;
    s->gpu = g->index;
    s->slot = slot;
    s->t = sim_time();
    integrals_at(g, s->t, &s->in);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlGpmSampleGet(nvmlDevice_t device, nvmlGpmSample_t gpmSample) {
    COUNT(nvmlGpmSampleGet);
    DEVICE(device, 0);
    return take_sample(g, -1, gpmSample);
}

nvmlReturn_t nvmlGpmMigSampleGet(nvmlDevice_t device, unsigned int gpuInstanceId,
                                 nvmlGpmSample_t gpmSample) {
    COUNT(nvmlGpmMigSampleGet);
    DEVICE(device, 0);
    if (!g->gpm)
        return NVML_ERROR_NOT_SUPPORTED;
    if (!mig_enabled(g))
        return NVML_ERROR_NOT_SUPPORTED;
    for (int k = 0; k < g->n_mig; k++) {
        if (g->mig[k].gi_id == gpuInstanceId) {
            nvmlReturn_t broken = fault(g, FN_nvmlGpmMigSampleGet, (int)gpuInstanceId);
            return broken != NVML_SUCCESS ? broken : take_sample(g, k, gpmSample);
        }
    }
    return NVML_ERROR_NOT_FOUND;
}

/* A metric's value; *ret gets its nvmlReturn. u = mean load over the interval. */
static double gpm_metric(const gpu_t *g, int slot, unsigned id, double u, double dt,
                         const integrals_t *a, const integrals_t *b, double t1, double t2,
                         nvmlReturn_t *ret) {
    const double MiB = 1024.0 * 1024.0;
    double share = slot < 0 ? 1.0 : (double)instance_slices(g, slot) / total_slices(g);
    *ret = NVML_SUCCESS;
    switch (id) {
    case 1: return 100.0 * u;        /* GRAPHICS_UTIL */
    case 2: return 92.0 * u;         /* SM_UTIL */
    case 3: return 55.0 * u;         /* SM_OCCUPANCY */
    case 4: return 8.0 * u;          /* INTEGER_UTIL */
    case 5: return 60.0 * u;         /* ANY_TENSOR_UTIL */
    case 6: return 2.0 * u;          /* DFMA_TENSOR_UTIL */
    case 7: return 50.0 * u;         /* HMMA_TENSOR_UTIL */
    case 8: return 3.0 * u;          /* DMMA_TENSOR_UTIL */
    case 9: return 5.0 * u;          /* IMMA_TENSOR_UTIL */
    case 10: return 70.0 * u;        /* DRAM_BW_UTIL */
    case 11: return 4.0 * u;         /* FP64_UTIL */
    case 12: return 30.0 * u;        /* FP32_UTIL */
    case 13: return 10.0 * u;        /* FP16_UTIL */
    case 20:                         /* PCIE_TX_PER_SEC */
    case 21: {                       /* PCIE_RX_PER_SEC */
        int rx = id == 21;
        double rate = dt > 1e-9 ? (pcie_bytes(g, t2, b, rx) - pcie_bytes(g, t1, a, rx)) / dt
                                : pcie_rate(g, gpu_load(g, t2), rx);
        return share * rate / MiB;
    }
    default: break;
    }
    int link = -1, rx = 0;
    if (id == 60 || id == 61) { /* NVLINK_TOTAL_RX/TX_PER_SEC */
        if (!g->nlinks) {
            *ret = NVML_ERROR_NOT_SUPPORTED;
            return 0.0;
        }
        double sum = 0.0;
        for (int l = 0; l < g->nlinks; l++)
            sum += nvlink_link_peak(g) * nvlink_weight(l, id == 60);
        return share * sum * u / MiB;
    }
    if (id >= 62 && id <= 97) {
        link = (int)(id - 62) / 2;
        rx = (id - 62) % 2 == 0;
    } else if (id >= 212 && id <= 247) {
        link = 18 + (int)(id - 212) / 2;
        rx = (id - 212) % 2 == 0;
    }
    if (link >= 0 && link < g->nlinks)
        return share * nvlink_link_peak(g) * nvlink_weight(link, rx) * u / MiB;
    *ret = NVML_ERROR_NOT_SUPPORTED;
    return 0.0;
}

static const char *gpm_metric_name(unsigned id) {
    switch (id) {
    case 1: return "gr_util";
    case 2: return "sm_util";
    case 3: return "sm_occupancy";
    case 4: return "integer_util";
    case 5: return "any_tensor_util";
    case 6: return "dfma_tensor_util";
    case 7: return "hmma_tensor_util";
    case 8: return "dmma_tensor_util";
    case 9: return "imma_tensor_util";
    case 10: return "dram_bw_util";
    case 11: return "fp64_util";
    case 12: return "fp32_util";
    case 13: return "fp16_util";
    case 20: return "pcie_tx";
    case 21: return "pcie_rx";
    case 60: return "nvlink_total_rx";
    case 61: return "nvlink_total_tx";
    default: return (id >= 62 && id <= 97) || (id >= 212 && id <= 247) ? "nvlink_link" : NULL;
    }
}

nvmlReturn_t nvmlGpmMetricsGet(nvmlGpmMetricsGet_t *metricsGet) {
    COUNT(nvmlGpmMetricsGet);
    OUT(metricsGet);
    INITIALIZED();
    if (metricsGet->version != NVML_GPM_METRICS_GET_VERSION)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    nvmlGpmSample_t s1 = metricsGet->sample1, s2 = metricsGet->sample2;
    if (!s1 || !s2 || s1->magic != GPM_MAGIC || s2->magic != GPM_MAGIC || !s1->taken ||
        !s2->taken || s1->gpu != s2->gpu || s1->slot != s2->slot ||
        metricsGet->numMetrics > NVML_GPM_METRIC_MAX)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (s1->gpu >= g_prof.ngpus)
        return NVML_ERROR_INVALID_ARGUMENT;
    const gpu_t *g = &g_prof.gpus[s1->gpu];
    if (gpu_lost(g->index, sim_time()))
        return NVML_ERROR_GPU_IS_LOST;
    int slot = s1->slot;
    if (slot >= 0 && (!mig_enabled(g) || slot >= g->n_mig))
        return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t broken =
        fault(g, FN_nvmlGpmMetricsGet, slot < 0 ? -1 : (int)g->mig[slot].gi_id);
    if (broken != NVML_SUCCESS && broken != FAULT_NAN)
        return broken;
    double dt = s2->t - s1->t;
    /* Every metric is a rate or a share of the interval: over no time at all (two samples of
     * one instant, as under a frozen clock) each is 0/0, which the driver hands back as NaN. */
    int empty = dt <= 1e-9 || broken == FAULT_NAN;
    double u = 0.0;
    if (!empty)
        u = clamp01(slot < 0 ? (s2->in.u - s1->in.u) / dt
                             : (s2->in.u_slot[slot] - s1->in.u_slot[slot]) / dt);
    for (unsigned i = 0; i < metricsGet->numMetrics; i++) {
        nvmlGpmMetric_t *m = &metricsGet->metrics[i];
        m->value = gpm_metric(g, slot, m->metricId, u, dt, &s1->in, &s2->in, s1->t, s2->t,
                              &m->nvmlReturn);
        if (empty && m->nvmlReturn == NVML_SUCCESS)
            m->value = NAN;
        const char *name = gpm_metric_name(m->metricId);
        m->metricInfo.shortName = name;
        m->metricInfo.longName = name;
        m->metricInfo.unit = !name ? NULL : (m->metricId >= 20 ? "MiB/sec" : "%");
    }
    return NVML_SUCCESS;
}

/* ------------------------------------------------------------------------------------------ */
/* Events                                                                                     */
/* ------------------------------------------------------------------------------------------ */

#define SUPPORTED_EVENTS                                                                           \
    (nvmlEventTypeSingleBitEccError | nvmlEventTypeDoubleBitEccError | nvmlEventTypePState |       \
     nvmlEventTypeXidCriticalError | nvmlEventTypeClock | nvmlEventTypeDramRetirementEvent |       \
     nvmlEventTypeDramRetirementFailure)

struct nvmlEventSet_st {
    unsigned magic;
    unsigned long long mask[MAX_GPUS];
    unsigned char delivered[MAX_SCENARIOS];
};

nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t *set) {
    COUNT(nvmlEventSetCreate);
    OUT(set);
    INITIALIZED();
    struct nvmlEventSet_st *s = calloc(1, sizeof(*s));
    if (!s)
        return NVML_ERROR_MEMORY;
    s->magic = EVENTSET_MAGIC;
    *set = s;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set) {
    COUNT(nvmlEventSetFree);
    INITIALIZED();
    if (!set || set->magic != EVENTSET_MAGIC)
        return NVML_ERROR_INVALID_ARGUMENT;
    set->magic = 0;
    free(set);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetSupportedEventTypes(nvmlDevice_t device,
                                              unsigned long long *eventTypes) {
    COUNT(nvmlDeviceGetSupportedEventTypes);
    OUT(eventTypes);
    DEVICE(device, 0);
    *eventTypes = SUPPORTED_EVENTS;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t device, unsigned long long eventTypes,
                                      nvmlEventSet_t set) {
    COUNT(nvmlDeviceRegisterEvents);
    DEVICE(device, 0);
    if (!set || set->magic != EVENTSET_MAGIC)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (eventTypes & ~SUPPORTED_EVENTS)
        return NVML_ERROR_NOT_SUPPORTED;
    pthread_mutex_lock(&g_lock);
    set->mask[g->index] |= eventTypes;
    pthread_mutex_unlock(&g_lock);
    return NVML_SUCCESS;
}

/* The event type a scenario raises, or 0. */
static unsigned long long scenario_event(const scenario_t *s) {
    if (!strcmp(s->kind, "xid"))
        return nvmlEventTypeXidCriticalError;
    if (!strcmp(s->kind, "ecc"))
        return nvmlEventTypeSingleBitEccError;
    return 0;
}

nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data,
                                 unsigned int timeoutms) {
    COUNT(nvmlEventSetWait_v2);
    OUT(data);
    INITIALIZED();
    if (!set || set->magic != EVENTSET_MAGIC)
        return NVML_ERROR_INVALID_ARGUMENT;
    double deadline = mono_now() + timeoutms / 1000.0;
    for (;;) {
        double t = sim_time();
        int due = -1;
        double next = INFINITY;
        pthread_mutex_lock(&g_lock);
        for (int i = 0; i < g_prof.nscenarios; i++) {
            const scenario_t *s = &g_prof.scenarios[i];
            unsigned long long type = scenario_event(s);
            if (!type || set->delivered[i] || !(set->mask[s->gpu] & type))
                continue;
            if (s->at <= t && (due < 0 || s->at < g_prof.scenarios[due].at))
                due = i;
            else if (s->at > t && s->at < next)
                next = s->at;
        }
        if (due >= 0) {
            const scenario_t *s = &g_prof.scenarios[due];
            set->delivered[due] = 1;
            pthread_mutex_unlock(&g_lock);
            data->device = &g_devices[s->gpu];
            data->eventType = scenario_event(s);
            data->eventData = !strcmp(s->kind, "xid") ? s->xid : 0;
            data->gpuInstanceId = NVML_VALUE_NOT_AVAILABLE_UINT;
            data->computeInstanceId = NVML_VALUE_NOT_AVAILABLE_UINT;
            return NVML_SUCCESS;
        }
        pthread_mutex_unlock(&g_lock);
        double now = mono_now();
        if (now >= deadline)
            return NVML_ERROR_TIMEOUT;
        double wait = deadline - now;
        if (next - t < wait)
            wait = next - t;
        /* A frozen clock may be moved by the caller meanwhile: re-check it regularly. A
         * running one is known in advance, so this waits once, to the timeout or the next
         * event, as the driver's wait sleeps once in the kernel: a watcher's idle wakes
         * cost what a real node's would. */
        const char *frozen = getenv("GPUCONSOLE_FAKE_NVML_TIME");
        if (frozen && *frozen && wait > 0.05)
            wait = 0.05;
        if (wait < 0.0005)
            wait = 0.0005;
        struct timespec ts = {(time_t)wait, (long)((wait - (time_t)wait) * 1e9)};
        nanosleep(&ts, NULL);
    }
}
