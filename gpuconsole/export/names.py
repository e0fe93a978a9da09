"""Every exported metric name, in one place.

GPU metrics keep dcgm-exporter's names and labels so the standard DCGM Grafana
dashboard (12239) works unchanged. dcgm-exporter types a few of them as counters
without the `_total` suffix; here they are gauges with the same name and value, so
`promtool check metrics` passes and every PromQL query (rate() included) still works.
Everything else is `gpuconsole_*` in base units.
"""

from __future__ import annotations

import functools

# dcgm-exporter labels, in its order
DCGM_LABELS = ("gpu", "UUID", "device", "modelName", "Hostname", "pci_bus_id")
MIG_LABELS = ("GPU_I_PROFILE", "GPU_I_ID")
OWNER_LABELS = ("pod", "namespace", "container")
# dcgm-exporter's labels for a device a ResourceClaim gave the pod (Kubernetes DRA)
DRA_OWNER_LABELS = (
    *OWNER_LABELS,
    "dra_claim_name",
    "dra_claim_namespace",
    "dra_device_name",
    "dra_driver_name",
    "dra_pool_name",
)
# gpuconsole's own metrics use snake_case labels
OWN_LABELS = ("node", "gpu", "uuid")

# (name, help) of per-GPU gauges
DCGM_GPU_UTIL = ("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).")
DCGM_MEM_COPY_UTIL = ("DCGM_FI_DEV_MEM_COPY_UTIL", "Memory utilization (in %).")
DCGM_FB_USED = ("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).")
DCGM_FB_FREE = ("DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB).")
DCGM_FB_RESERVED = ("DCGM_FI_DEV_FB_RESERVED", "Framebuffer memory reserved (in MiB).")
DCGM_GPU_TEMP = ("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C).")
DCGM_MEMORY_TEMP = ("DCGM_FI_DEV_MEMORY_TEMP", "Memory temperature (in C).")
DCGM_POWER_USAGE = ("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W).")
DCGM_POWER_LIMIT = ("DCGM_FI_DEV_POWER_MGMT_LIMIT", "Power management limit (in W).")
DCGM_ENERGY = (
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
    "Total energy consumption since boot (in mJ).",
)
DCGM_SM_CLOCK = ("DCGM_FI_DEV_SM_CLOCK", "SM clock frequency (in MHz).")
DCGM_MEM_CLOCK = ("DCGM_FI_DEV_MEM_CLOCK", "Memory clock frequency (in MHz).")
DCGM_PSTATE = ("DCGM_FI_DEV_PSTATE", "Performance state (0 is highest).")
DCGM_THROTTLE = (
    "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS",
    "Clock throttle reasons in force now or since the previous poll (bitmask, NVML's bits).",
)
DCGM_PCIE_REPLAY = ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "Total number of PCIe retries.")
DCGM_PCIE_GEN = ("DCGM_FI_DEV_PCIE_LINK_GEN", "PCIe link generation.")
DCGM_PCIE_WIDTH = ("DCGM_FI_DEV_PCIE_LINK_WIDTH", "PCIe link width.")
DCGM_XID = ("DCGM_FI_DEV_XID_ERRORS", "Value of the last XID error encountered.")
DCGM_ECC_SBE_VOL = ("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "Total single-bit volatile ECC errors.")
DCGM_ECC_DBE_VOL = ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "Total double-bit volatile ECC errors.")
DCGM_ECC_SBE_AGG = ("DCGM_FI_DEV_ECC_SBE_AGG_TOTAL", "Total single-bit persistent ECC errors.")
DCGM_ECC_DBE_AGG = ("DCGM_FI_DEV_ECC_DBE_AGG_TOTAL", "Total double-bit persistent ECC errors.")
DCGM_REMAP_COR = ("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "Rows remapped for correctable errors.")
DCGM_REMAP_UNC = (
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
    "Rows remapped for uncorrectable errors.",
)
DCGM_REMAP_FAILURE = ("DCGM_FI_DEV_ROW_REMAP_FAILURE", "Whether remapping of rows has failed.")
DCGM_REMAP_PENDING = ("DCGM_FI_DEV_ROW_REMAP_PENDING", "Whether a row remap awaits a GPU reset.")
# dynamic page retirement, before Ampere (absent where the GPU remaps rows instead)
DCGM_RETIRED_SBE = ("DCGM_FI_DEV_RETIRED_SBE", "Pages retired for single-bit errors.")
DCGM_RETIRED_DBE = ("DCGM_FI_DEV_RETIRED_DBE", "Pages retired for double-bit errors.")
DCGM_RETIRED_PENDING = (
    "DCGM_FI_DEV_RETIRED_PENDING",
    "Whether a page retirement awaits a GPU reset.",
)
# DCGM's field 449 is a rate, not the running total its name suggests: the NVLink data
# counters of every link, both directions, differenced over time, in MiB/s.
DCGM_NVLINK_TOTAL = (
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
    "NVLink throughput, all links, both directions (in MiB/s).",
)

# Profiling metrics. The ratios come from the GPM metric of the same meaning (Hopper and
# newer), in 0..1 as dcgm-exporter reports them where GPM gives percent. The byte rates
# come from GPM too, else from NVML's PCIe and NVLink data counters, on any GPU: DCGM
# replaced its PCIe throughput fields (200, 201) with these.
PROF_GR_ENGINE = ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "Ratio of time the graphics engine is active.")
PROF_SM_ACTIVE = ("DCGM_FI_PROF_SM_ACTIVE", "Ratio of cycles an SM has at least 1 warp assigned.")
PROF_SM_OCCUPANCY = ("DCGM_FI_PROF_SM_OCCUPANCY", "Ratio of resident warps to the maximum.")
PROF_TENSOR = ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "Ratio of cycles the tensor pipe is active.")
PROF_DRAM = ("DCGM_FI_PROF_DRAM_ACTIVE", "Ratio of cycles the device memory interface is active.")
PROF_FP64 = ("DCGM_FI_PROF_PIPE_FP64_ACTIVE", "Ratio of cycles the FP64 pipe is active.")
PROF_FP32 = ("DCGM_FI_PROF_PIPE_FP32_ACTIVE", "Ratio of cycles the FP32 pipe is active.")
PROF_FP16 = ("DCGM_FI_PROF_PIPE_FP16_ACTIVE", "Ratio of cycles the FP16 pipe is active.")
PROF_PCIE_TX = ("DCGM_FI_PROF_PCIE_TX_BYTES", "PCIe bytes transmitted per second.")
PROF_PCIE_RX = ("DCGM_FI_PROF_PCIE_RX_BYTES", "PCIe bytes received per second.")
PROF_NVLINK_TX = ("DCGM_FI_PROF_NVLINK_TX_BYTES", "NVLink bytes transmitted per second.")
PROF_NVLINK_RX = ("DCGM_FI_PROF_NVLINK_RX_BYTES", "NVLink bytes received per second.")

# gpuconsole's own
PREFIX = "gpuconsole"
SOURCE_UP = (f"{PREFIX}_source_up", "1 when the source's latest poll succeeded.")
SOURCE_LAST_OK = (
    f"{PREFIX}_source_last_success_timestamp_seconds",
    "When the source last returned a reading.",
)
SOURCE_STALE = (f"{PREFIX}_source_stale_seconds", "How long the source has been stale (0: fresh).")
SOURCE_POLL = (f"{PREFIX}_source_poll_duration_seconds", "Duration of the source's last poll.")
GPU_INFO = (f"{PREFIX}_gpu_info", "Identity and placement of a GPU.")
GPU_LOST = (f"{PREFIX}_gpu_lost", "1 when the GPU fell off the bus or needs a reset.")
GPU_HEALTH = (f"{PREFIX}_gpu_health", "GPU health at a glance: 1 for the current state.")
GPU_VERDICT = (
    f"{PREFIX}_gpu_verdict",
    "What to do with the GPU (label action; label gpu: its PCI bus id, the GPU NVML numbers "
    "and the one it cannot see alike); the value is the action's rank: 0 fit, 1 watch, "
    "2 drain, 3 reset_gpu, 4 reboot_node, 5 reseat, 6 service.",
)
NODE_VERDICT = (
    f"{PREFIX}_node_verdict",
    "What to do with the node (label action), its GPUs' and every source's evidence "
    "together; the value is the action's rank, as for gpuconsole_gpu_verdict.",
)
NODE_GPUS_FLAGGED = (
    f"{PREFIX}_node_gpus_flagged",
    "GPUs of the node with a health flag raised in their own series: lost, an XID "
    "(DCGM_FI_DEV_XID_ERRORS above 0), uncorrectable volatile ECC errors, a row remap "
    "pending or failed, memory pages retired or a retirement pending, clocks held down by "
    "heat or power. 0: none of those series of the node is above 0.",
)
GPU_XID_WINDOW = (
    f"{PREFIX}_gpu_xid_window",
    "Times the GPU raised this XID within the health window, since its last reset or reboot "
    "(label mnemonic: NVIDIA's name for the code, empty for one its catalog lacks).",
)
VERDICT_LABELS = ("node", "gpu", "uuid", "action")  # gpu: the PCI bus id, sysfs form
XID_WINDOW_LABELS = ("node", "gpu", "uuid", "xid", "mnemonic")
GPU_THROTTLE = (f"{PREFIX}_gpu_throttle_reason", "1 for each active clock throttle reason.")
GPU_NVLINK_ACTIVE = (f"{PREFIX}_gpu_nvlink_active_links", "NVLinks up on this GPU.")
GPU_PCIE_MAX_GEN = (f"{PREFIX}_gpu_pcie_max_link_generation", "PCIe generation the GPU supports.")
GPU_PCIE_MAX_WIDTH = (f"{PREFIX}_gpu_pcie_max_link_width", "PCIe width the GPU supports.")
GPU_PCIE_DOWNTRAINED = (
    f"{PREFIX}_gpu_pcie_downtrained",
    "1 when the link runs narrower than its max, or at a lower generation while the GPU works.",
)
NVLINK_TX = (f"{PREFIX}_nvlink_transmit_bytes_total", "Bytes sent on one NVLink.")
NVLINK_RX = (f"{PREFIX}_nvlink_receive_bytes_total", "Bytes received on one NVLink.")
GPU_NVLINK_ERRORS = (
    f"{PREFIX}_gpu_nvlink_errors_total",
    "One NVLink's data link errors since the driver loaded, by counter: replay, recovery "
    "(the link retrained) and crc.",
)
MIG_INFO = (f"{PREFIX}_mig_instance_info", "A MIG instance carved out of a GPU.")
TOPOLOGY = (f"{PREFIX}_gpu_topology_info", "How two GPUs are connected (nvidia-smi topo codes).")
EVENTS = (f"{PREFIX}_events_total", "Events recorded, by kind and severity.")
FABRIC_MANAGER = (
    f"{PREFIX}_fabric_manager_running",
    "1 when the NVIDIA Fabric Manager service runs (NVSwitch systems; absent elsewhere).",
)
NODE_SIMULATED = (f"{PREFIX}_node_simulated", "1 when the node's data comes from the simulator.")
SNAPSHOT_AGE = (f"{PREFIX}_snapshot_timestamp_seconds", "When the exported snapshot was taken.")

# --- BMC, under ipmi_exporter's names (prometheus-community/ipmi_exporter collector*.go) ---
# ipmi_exporter serves one BMC per scrape and relies on the target's `instance` label; one
# gpuconsole process can serve many nodes (a head reading its agents), so every BMC series
# here also carries `node`. Sensor states: 0 nominal, 1 warning, 2 critical, NaN for N/A.
IPMI_SENSOR_LABELS = ("node", "id", "name")
IPMI_UP = ("ipmi_up", "'1' if a scrape of the IPMI device was successful, '0' otherwise.")
IPMI_TEMPERATURE = ("ipmi_temperature_celsius", "Temperature reading in degree Celsius.")
IPMI_TEMPERATURE_STATE = (
    "ipmi_temperature_state",
    "Reported state of a temperature sensor (0=nominal, 1=warning, 2=critical).",
)
IPMI_FAN_RPM = ("ipmi_fan_speed_rpm", "Fan speed in rotations per minute.")
IPMI_FAN_RATIO = ("ipmi_fan_speed_ratio", "Fan speed as a proportion of the maximum speed.")
IPMI_FAN_STATE = (
    "ipmi_fan_speed_state",
    "Reported state of a fan speed sensor (0=nominal, 1=warning, 2=critical).",
)
IPMI_VOLTAGE = ("ipmi_voltage_volts", "Voltage reading in Volts.")
IPMI_VOLTAGE_STATE = (
    "ipmi_voltage_state",
    "Reported state of a voltage sensor (0=nominal, 1=warning, 2=critical).",
)
IPMI_CURRENT = ("ipmi_current_amperes", "Current reading in Amperes.")
IPMI_CURRENT_STATE = (
    "ipmi_current_state",
    "Reported state of a current sensor (0=nominal, 1=warning, 2=critical).",
)
IPMI_POWER = ("ipmi_power_watts", "Power reading in Watts.")
IPMI_POWER_STATE = (
    "ipmi_power_state",
    "Reported state of a power sensor (0=nominal, 1=warning, 2=critical).",
)
IPMI_SENSOR_VALUE = (
    "ipmi_sensor_value",
    "Generic data read from an IPMI sensor of unknown type, relying on labels for context.",
)
IPMI_SENSOR_STATE = (
    "ipmi_sensor_state",
    "Indicates the severity of the state reported by an IPMI sensor "
    "(0=nominal, 1=warning, 2=critical).",
)
IPMI_CHASSIS_POWER = ("ipmi_chassis_power_state", "Current power state (1=on, 0=off).")

# --- BMC, what ipmi_exporter lacks ----------------------------------------------------------
BMC_INFO = (f"{PREFIX}_bmc_info", "The BMC a node is read through (its address, no credentials).")
BMC_HEALTH = (
    f"{PREFIX}_bmc_health",
    "BMC health at a glance, as the console's BMC light (the verdict's BMC evidence, stale while "
    "the source is): 1 for the current state.",
)
BMC_INLET = (f"{PREFIX}_bmc_inlet_temperature_celsius", "Air temperature at the server's intake.")
BMC_EXHAUST = (
    f"{PREFIX}_bmc_exhaust_temperature_celsius",
    "Air temperature at the server's exhaust.",
)
BMC_POWER = (
    f"{PREFIX}_bmc_power_watts",
    "Server input power from the BMC's total power sensor, else the sum of its PSUs.",
)
BMC_FANS = (f"{PREFIX}_bmc_fans", "Fans the BMC reports.")
BMC_FANS_FAILED = (f"{PREFIX}_bmc_fans_failed", "Fans failed, stopped or past a critical limit.")
BMC_PSUS = (f"{PREFIX}_bmc_psus", "Power supplies the BMC reports present.")
BMC_PSUS_FAILED = (f"{PREFIX}_bmc_psus_failed", "Power supplies failed or past a critical limit.")
BMC_PSUS_NO_INPUT = (
    f"{PREFIX}_bmc_psus_no_input",
    "Power supplies there, not failed, whose input power is lost or out of range.",
)
BMC_CLOCK_SKEW = (
    f"{PREFIX}_bmc_clock_skew_seconds",
    "How far the BMC's clock is ahead of the reader's (negative: behind), when its log was read.",
)
BMC_PART_UP = (
    f"{PREFIX}_bmc_part_up",
    "1 if this part of the BMC (a Redfish resource, the system read for power) was read in "
    "the last poll, 0 if it failed while the rest was read; parts left out are not listed.",
)
GPU_BOARD_LABELS = ("node", "gpu", "uuid", "module", "sensor")
GPU_BOARD_TEMPERATURE = (
    f"{PREFIX}_gpu_board_temperature_celsius",
    "A GPU module's temperature as the HGX baseboard reports it (gpu empty: not matched).",
)
GPU_BOARD_POWER = (
    f"{PREFIX}_gpu_board_power_watts",
    "A GPU module's power as the HGX baseboard reports it (gpu empty: not matched).",
)
GPU_BOARD_VOLTAGE = (
    f"{PREFIX}_gpu_board_voltage_volts",
    "A GPU module's voltage as the HGX baseboard reports it (gpu empty: not matched).",
)
GPU_BOARD_ENERGY = (
    f"{PREFIX}_gpu_board_energy_joules_total",
    "A GPU module's energy as the HGX baseboard counts it (gpu empty: not matched).",
)

# --- Fabric, under node_exporter's names (collector/infiniband_linux.go, procfs sysfs) ----
# node_exporter labels these {device, port} and relies on `instance`; `node` is added here
# for the same reason as on the BMC series.
IB_PORT_LABELS = ("node", "device", "port")
IB_INFO = (
    "node_infiniband_info",
    "Non-numeric data from /sys/class/infiniband/<device>, value is always 1.",
)
IB_STATE = (
    "node_infiniband_state_id",
    "State of the InfiniBand port (0: no change, 1: down, 2: init, 3: armed, 4: active, "
    "5: act defer)",
)
IB_PHYSICAL_STATE = (
    "node_infiniband_physical_state_id",
    "Physical state of the InfiniBand port (0: no change, 1: sleep, 2: polling, 3: disable, "
    "4: shift, 5: link up, 6: link error recover, 7: phytest)",
)
IB_RATE = ("node_infiniband_rate_bytes_per_second", "Maximum signal transfer rate")
IB_LIFESPAN = (
    "node_infiniband_lifespan_seconds",
    "The maximum period in ms which defines the aging of the counter reads. Two consecutive "
    "reads within this period might return the same values.",
)
# sysfs file under counters/ or hw_counters/ -> (metric, help). port_{xmit,rcv}_data are
# multiplied by 4 (octets / 4 in sysfs), as procfs does.
IB_COUNTERS: dict[str, tuple[str, str]] = {
    "excessive_buffer_overrun_errors": (
        "node_infiniband_excessive_buffer_overrun_errors_total",
        "Number of times that OverrunErrors consecutive flow control update periods occurred, "
        "each having at least one overrun error.",
    ),
    "link_downed": (
        "node_infiniband_link_downed_total",
        "Number of times the link failed to recover from an error state and went down",
    ),
    "link_error_recovery": (
        "node_infiniband_link_error_recovery_total",
        "Number of times the link successfully recovered from an error state",
    ),
    "local_link_integrity_errors": (
        "node_infiniband_local_link_integrity_errors_total",
        "Number of times that the count of local physical errors exceeded the threshold "
        "specified by LocalPhyErrors.",
    ),
    "multicast_rcv_packets": (
        "node_infiniband_multicast_packets_received_total",
        "Number of multicast packets received (including errors)",
    ),
    "multicast_xmit_packets": (
        "node_infiniband_multicast_packets_transmitted_total",
        "Number of multicast packets transmitted (including errors)",
    ),
    "port_rcv_constraint_errors": (
        "node_infiniband_port_constraint_errors_received_total",
        "Number of packets received on the switch physical port that are discarded",
    ),
    "port_xmit_constraint_errors": (
        "node_infiniband_port_constraint_errors_transmitted_total",
        "Number of packets not transmitted from the switch physical port",
    ),
    "port_rcv_data": (
        "node_infiniband_port_data_received_bytes_total",
        "Number of data octets received on all links",
    ),
    "port_xmit_data": (
        "node_infiniband_port_data_transmitted_bytes_total",
        "Number of data octets transmitted on all links",
    ),
    "port_rcv_discards": (
        "node_infiniband_port_discards_received_total",
        "Number of inbound packets discarded by the port because the port is down or congested",
    ),
    "port_xmit_discards": (
        "node_infiniband_port_discards_transmitted_total",
        "Number of outbound packets discarded by the port because the port is down or congested",
    ),
    "port_rcv_errors": (
        "node_infiniband_port_errors_received_total",
        "Number of packets containing an error that were received on this port",
    ),
    "port_rcv_packets": (
        "node_infiniband_port_packets_received_total",
        "Number of packets received on all VLs by this port (including errors)",
    ),
    "port_xmit_packets": (
        "node_infiniband_port_packets_transmitted_total",
        "Number of packets transmitted on all VLs from this port (including errors)",
    ),
    "port_xmit_wait": (
        "node_infiniband_port_transmit_wait_total",
        "Number of ticks during which the port had data to transmit but no data was sent "
        "during the entire tick",
    ),
    "unicast_rcv_packets": (
        "node_infiniband_unicast_packets_received_total",
        "Number of unicast packets received (including errors)",
    ),
    "unicast_xmit_packets": (
        "node_infiniband_unicast_packets_transmitted_total",
        "Number of unicast packets transmitted (including errors)",
    ),
    "port_rcv_remote_physical_errors": (
        "node_infiniband_port_receive_remote_physical_errors_total",
        "Number of packets marked with the EBP (End of Bad Packet) delimiter received on the port.",
    ),
    "port_rcv_switch_relay_errors": (
        "node_infiniband_port_receive_switch_relay_errors_total",
        "Number of packets that could not be forwarded by the switch.",
    ),
    "symbol_error": (
        "node_infiniband_symbol_error_total",
        "Number of minor link errors detected on one or more physical lanes.",
    ),
    "VL15_dropped": (
        "node_infiniband_vl15_dropped_total",
        "Number of incoming VL15 packets dropped due to resource limitations.",
    ),
    # hw_counters/ (mlx5, irdma)
    "duplicate_request": (
        "node_infiniband_duplicate_requests_packets_total",
        "The number of received packets. A duplicate request is a request that had been "
        "previously executed.",
    ),
    "implied_nak_seq_err": (
        "node_infiniband_implied_nak_seq_errors_total",
        "The number of time the requested decided an ACK. with a PSN larger than the expected "
        "PSN for an RDMA read or response.",
    ),
    "local_ack_timeout_err": (
        "node_infiniband_local_ack_timeout_errors_total",
        "The number of times QP's ack timer expired for RC, XRC, DCT QPs at the sender side.",
    ),
    "np_cnp_sent": (
        "node_infiniband_np_cnp_packets_sent_total",
        "The number of CNP packets sent by the Notification Point when it noticed congestion "
        "experienced in the RoCEv2 IP header (ECN bits).",
    ),
    "np_ecn_marked_roce_packets": (
        "node_infiniband_np_ecn_marked_roce_packets_received_total",
        "The number of RoCEv2 packets received by the notification point which were marked for "
        "experiencing the congestion.",
    ),
    "out_of_buffer": (
        "node_infiniband_out_of_buffer_drops_total",
        "The number of drops occurred due to lack of WQE for the associated QPs.",
    ),
    "out_of_sequence": (
        "node_infiniband_out_of_sequence_packets_received_total",
        "The number of out of sequence packets received.",
    ),
    "packet_seq_err": (
        "node_infiniband_packet_sequence_errors_total",
        "The number of received NAK sequence error packets. The QP retry limit was not exceeded.",
    ),
    "req_cqe_error": (
        "node_infiniband_req_cqes_errors_total",
        "The number of times requester detected CQEs completed with errors.",
    ),
    "req_cqe_flush_error": (
        "node_infiniband_req_cqes_flush_errors_total",
        "The number of times requester detected CQEs completed with flushed errors.",
    ),
    "req_remote_access_errors": (
        "node_infiniband_req_remote_access_errors_total",
        "The number of times requester detected remote access errors.",
    ),
    "req_remote_invalid_request": (
        "node_infiniband_req_remote_invalid_request_errors_total",
        "The number of times requester detected remote invalid request errors.",
    ),
    "resp_cqe_error": (
        "node_infiniband_resp_cqes_errors_total",
        "The number of times responder detected CQEs completed with errors.",
    ),
    "resp_cqe_flush_error": (
        "node_infiniband_resp_cqes_flush_errors_total",
        "The number of times responder detected CQEs completed with flushed errors.",
    ),
    "resp_local_length_error": (
        "node_infiniband_resp_local_length_errors_total",
        "The number of times responder detected local length errors.",
    ),
    "resp_remote_access_errors": (
        "node_infiniband_resp_remote_access_errors_total",
        "The number of times responder detected remote access errors.",
    ),
    "rnr_nak_retry_err": (
        "node_infiniband_rnr_nak_retry_packets_received_total",
        "The number of received RNR NAK packets. The QP retry limit was not exceeded.",
    ),
    "roce_adp_retrans": (
        "node_infiniband_roce_adp_retransmits_total",
        "The number of adaptive retransmissions for RoCE traffic.",
    ),
    "roce_adp_retrans_to": (
        "node_infiniband_roce_adp_retransmits_timeout_total",
        "The number of times RoCE traffic reached timeout due to adaptive retransmission.",
    ),
    "roce_slow_restart": (
        "node_infiniband_roce_slow_restart_used_total",
        "The number of times RoCE slow restart was used.",
    ),
    "roce_slow_restart_cnps": (
        "node_infiniband_roce_slow_restart_cnps_total",
        "The number of times RoCE slow restart generated CNP packets.",
    ),
    "roce_slow_restart_trans": (
        "node_infiniband_roce_slow_restart_total",
        "The number of times RoCE slow restart changed state to slow restart.",
    ),
    "rp_cnp_handled": (
        "node_infiniband_rp_cnp_packets_handled_total",
        "The number of CNP packets handled by the Reaction Point HCA to throttle the "
        "transmission rate.",
    ),
    "rp_cnp_ignored": (
        "node_infiniband_rp_cnp_ignored_packets_received_total",
        "The number of CNP packets received and ignored by the Reaction Point HCA.",
    ),
    "rx_atomic_requests": (
        "node_infiniband_rx_atomic_requests_total",
        "The number of received ATOMIC request for the associated QPs.",
    ),
    "rx_dct_connect": (
        "node_infiniband_rx_dct_connect_requests_total",
        "The number of received connection requests for the associated DCTs.",
    ),
    "rx_icrc_encapsulated": (
        "node_infiniband_rx_icrc_encapsulated_errors_total",
        "The number of RoCE packets with ICRC errors.",
    ),
    "rx_read_requests": (
        "node_infiniband_rx_read_requests_total",
        "The number of received READ requests for the associated QPs.",
    ),
    "rx_write_requests": (
        "node_infiniband_rx_write_requests_total",
        "The number of received WRITE requests for the associated QPs.",
    ),
}
# counters_ext/ (kernels before 4.5, mlx4): the 64-bit PortCountersExtended
IB_LEGACY_COUNTERS: dict[str, tuple[str, str]] = {
    "port_multicast_rcv_packets": (
        "node_infiniband_legacy_multicast_packets_received_total",
        "Number of multicast packets received",
    ),
    "port_multicast_xmit_packets": (
        "node_infiniband_legacy_multicast_packets_transmitted_total",
        "Number of multicast packets transmitted",
    ),
    "port_rcv_data_64": (
        "node_infiniband_legacy_data_received_bytes_total",
        "Number of data octets received on all links",
    ),
    "port_rcv_packets_64": (
        "node_infiniband_legacy_packets_received_total",
        "Number of data packets received on all links",
    ),
    "port_unicast_rcv_packets": (
        "node_infiniband_legacy_unicast_packets_received_total",
        "Number of unicast packets received",
    ),
    "port_unicast_xmit_packets": (
        "node_infiniband_legacy_unicast_packets_transmitted_total",
        "Number of unicast packets transmitted",
    ),
    "port_xmit_data_64": (
        "node_infiniband_legacy_data_transmitted_bytes_total",
        "Number of data octets transmitted on all links",
    ),
    "port_xmit_packets_64": (
        "node_infiniband_legacy_packets_transmitted_total",
        "Number of data packets transmitted on all links",
    ),
}
# octets / 4 in sysfs, in counters/ and counters_ext/ alike: multiplied by 4, as procfs does
IB_DATA_COUNTERS = frozenset(
    {"port_rcv_data", "port_xmit_data", "port_rcv_data_64", "port_xmit_data_64"}
)

# --- Fabric, gpuconsole's own -----------------------------------------------------------------
FABRIC_HW_STAT = (
    f"{PREFIX}_fabric_port_hw_stat_total",
    "A hw_counters/ file node_exporter has no name for, raw, by its sysfs name (stat).",
)
FABRIC_PORT_INFO = (
    f"{PREFIX}_fabric_port_info",
    "An RDMA port: its role (compute, storage, management), link layer, netdev and PCI place.",
)
FABRIC_PORT_SEVERITY = (
    f"{PREFIX}_fabric_port_severity",
    "The worst problem on the port now (0=ok, 1=warning, 2=critical).",
)
FABRIC_PORT_PROBLEM = (
    f"{PREFIX}_fabric_port_problem",
    "1 for each problem on the port now: a link state, or the counter that moved.",
)
FABRIC_PORT_COUNTER_PEGGED = (
    f"{PREFIX}_fabric_port_counter_pegged",
    "1 for each PortCounter (counter, its sysfs name) at its maximum: it counts no more.",
)
FABRIC_PORT_EXPECTED_RATE = (
    f"{PREFIX}_fabric_port_expected_rate_bytes_per_second",
    "The rate a healthy port of this role runs at on this node.",
)
FABRIC_NETDEV_UP = (
    f"{PREFIX}_fabric_port_netdev_up",
    "1 when the port's netdev is operationally up (rtnetlink operstate UP or UNKNOWN).",
)
FABRIC_NETDEV_CARRIER = (
    f"{PREFIX}_fabric_port_netdev_carrier",
    "1 when the port's netdev has carrier.",
)
FABRIC_PEERMEM = (
    f"{PREFIX}_fabric_peermem_loaded",
    "1 when nvidia-peermem (GPUDirect RDMA) is loaded.",
)
GPU_NIC_AFFINITY = (
    f"{PREFIX}_gpu_nic_affinity_info",
    "The NIC a GPU should use for GPUDirect RDMA and how near it is (nvidia-smi topo level).",
)
GPU_NIC_FALLBACK = (
    f"{PREFIX}_gpu_nic_fallback_info",
    "The NIC a GPU uses for GPUDirect RDMA while its own rail is down, and how near it is.",
)
GPU_GPUDIRECT_FLAG = (
    f"{PREFIX}_gpu_gpudirect_flag",
    "1 for each reason the GPU's GPUDirect RDMA pairing is not what it should be.",
)

# --- Ownership -----------------------------------------------------------------------------
GPU_OWNER_INFO = (
    f"{PREFIX}_gpu_owner_info",
    "Who holds a GPU, one row per holder (free or unavailable when none), including GPUs "
    "NVML cannot see (vfio-pci).",
)
MIG_OWNER_INFO = (f"{PREFIX}_mig_owner_info", "Who holds a MIG instance, one row per holder.")
GUEST_UP = (
    f"{PREFIX}_guest_up",
    "1 when a KVM guest's agent answered the host's latest ask for its passthrough GPUs.",
)
GUEST_READING_AGE = (
    f"{PREFIX}_guest_reading_age_seconds",
    "Seconds since a passthrough GPU's guest agent last answered for it.",
)
GPU_OWNER_MEM_USED = (
    f"{PREFIX}_gpu_owner_memory_used_bytes",
    "GPU memory a holder's processes use, per NVML: each sharer's of a shared GPU.",
)
GPU_OWNER_MEM_LIMIT = (
    f"{PREFIX}_gpu_owner_memory_limit_bytes",
    "A sharer's GPU memory quota (HAMi vGPU, MPS client limit), where it runs under one.",
)
GPU_OWNER_SM_LIMIT = (
    f"{PREFIX}_gpu_owner_sm_limit_ratio",
    "A sharer's share of the GPU's SMs (HAMi, MPS active thread percentage), 0 to 1.",
)
TENANT_GPUS = (
    f"{PREFIX}_tenant_gpus",
    "GPUs on the node per tenant and kind of holder (tenant empty: none mapped).",
)
OWNERSHIP_PROBLEM = (
    f"{PREFIX}_ownership_problem",
    "Ownership inconsistencies, counted by kind and place (gpu empty: node-wide).",
)


def _is_spec(value: object) -> bool:
    return (
        isinstance(value, tuple)
        and len(value) == 2
        and all(isinstance(part, str) for part in value)
    )


@functools.cache
def series_names() -> frozenset[str]:
    """Every sample name the exporter writes (what alert rules may read): the name of each
    (name, help) pair above; a counter's is spelt with its _total, as its samples are."""
    found: set[str] = set()
    for key, value in globals().items():
        if not key.isupper() or key.endswith("_LABELS"):
            continue
        specs = value.values() if isinstance(value, dict) else (value,)
        found.update(spec[0] for spec in specs if _is_spec(spec))
    return frozenset(found)
