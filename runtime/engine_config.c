/* engine_config: the fusion engine's configuration from the KOLO_*
 * parameters. The runtime reads parameters and hands each module a config
 * struct, so fusion/ reads none itself (docs/architecture.md). */
#include "fusion.h"
#include "runtime.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void kolo_runtime_engine_config(struct kolo_engine_config *cfg)
{
	memset(cfg, 0, sizeof(*cfg));
	int64_t thr = kolo_param_int(KOLO_P_FUSION_THRESHOLD);
	cfg->fusion_threshold = thr > 0 ? (uint64_t)thr : 0;
	int64_t direct = kolo_param_int(KOLO_P_FUSION_DIRECT_BYTES);
	cfg->direct_bytes = direct > 0 ? (uint64_t)direct : 0;
	cfg->cycle_time_ms = kolo_param_float(KOLO_P_CYCLE_TIME);
	if (!(cfg->cycle_time_ms >= 0))
		cfg->cycle_time_ms = 0;
	int64_t cap = kolo_param_int(KOLO_P_CACHE_CAPACITY);
	cfg->cache_capacity = cap < 0 ? 0 : (cap > 1 << 20 ? 1 << 20 : (int)cap);
	snprintf(cfg->timeline, sizeof(cfg->timeline), "%s", kolo_param_str(KOLO_P_TIMELINE));
	cfg->timeline_mark_cycles = kolo_param_bool(KOLO_P_TIMELINE_MARK_CYCLES);
	cfg->stall_check = !kolo_param_bool(KOLO_P_STALL_CHECK_DISABLE);
	cfg->stall_check_s = kolo_param_float(KOLO_P_STALL_CHECK_SECONDS);
	cfg->stall_shutdown_s = kolo_param_float(KOLO_P_STALL_SHUTDOWN_SECONDS);
	cfg->autotune = kolo_param_bool(KOLO_P_AUTOTUNE);
	snprintf(cfg->autotune_log, sizeof(cfg->autotune_log), "%s",
	         kolo_param_str(KOLO_P_AUTOTUNE_LOG));
	int64_t to = kolo_param_int(KOLO_P_TIMEOUT_MS);
	int64_t def = strtoll(kolo_param_info(KOLO_P_TIMEOUT_MS)->def, NULL, 10);
	cfg->timeout_ms = (int)(to > 0 && to < INT32_MAX ? to : def);
	cfg->idle_heartbeat_ms = 0;
}
