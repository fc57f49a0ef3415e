/* kolo on MXNet's dependency engine (include/kolo/mxnet.h). */
#include "kolo/mxnet.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* MXNet 1.x C API (include/mxnet/c_api.h), declared here: no MXNet header. */
typedef void (*mx_async_fn)(void *run_ctx, void *on_complete, void *param);
typedef void (*mx_deleter_fn)(void *param);
typedef int (*mx_push_fn)(mx_async_fn fn, void *param, mx_deleter_fn deleter, void *ctx,
                          void **const_nds, int num_const, void **mutable_nds, int num_mutable,
                          void *prop, int priority, const char *opr_name, bool wait);
typedef int (*mx_get_data_fn)(void *nd, void **data);
typedef int (*mx_shallow_copy_fn)(void *src, void **out);
typedef int (*mx_free_fn)(void *nd);

/* engine::CallbackOnComplete (include/mxnet/engine.h): three pointers; calling
 * fn(engine, param, NULL) marks the operation done without an error. */
struct mx_on_complete {
	void (*fn)(void *engine, void *param, const void *error);
	void *engine;
	void *param;
};

/* mxnet::Context: {DeviceType dev_type; int32_t dev_id;}, kCPU = 1. */
struct mx_context {
	int dev_type;
	int dev_id;
};

static struct {
	pthread_mutex_t lock;
	int bound;
	mx_push_fn push;
	mx_get_data_fn get_data;
	mx_shallow_copy_fn shallow_copy;
	mx_free_fn free_nd;
	kolo_status_t err;
	char err_msg[1024];
} mx = {.lock = PTHREAD_MUTEX_INITIALIZER};

static atomic_int mx_pending;
static const struct mx_context mx_cpu = {1, 0};

enum mx_kind { MX_ALLREDUCE, MX_BROADCAST, MX_REDUCESCATTER, MX_ALLGATHER };

static const char *const mx_kind_name[] = {"allreduce", "broadcast", "reducescatter", "allgather"};
static const char *const mx_opr_name[] = {"kolo_allreduce", "kolo_broadcast", "kolo_reducescatter",
                                          "kolo_allgather"};

/* One pushed operation: its own references to the arrays (shallow copies,
 * freed with it), the names, and the MXNet callback to complete. */
struct mx_op {
	enum mx_kind kind;
	kolo_comm_t *comm;
	int n;
	char **names;
	void **in, **out; /* NDArray handles, ours */
	void *token;      /* orders the operations of one name (may be NULL) */
	void **rw;        /* 2n + 1: the handles read and written, for the push */
	void **data;      /* 2n: their memory, filled when the engine runs it */
	size_t *counts;
	kolo_dtype_t dtype;
	kolo_op_t op;
	double pre, post;
	int root;
	size_t *gathered; /* MX_ALLGATHER: every rank's count, filled by kolo */
	struct mx_on_complete done;
};

kolo_status_t kolo_mx_bind(const char *path)
{
	if (path == NULL)
		return KOLO_EINVAL;
	pthread_mutex_lock(&mx.lock);
	kolo_status_t st = KOLO_OK;
	if (!mx.bound) {
		void *h = dlopen(path, RTLD_NOW | RTLD_NOLOAD);
		if (h == NULL) {
			st = KOLO_EINVAL;
		} else {
			*(void **)&mx.push = dlsym(h, "MXEnginePushAsyncND");
			*(void **)&mx.get_data = dlsym(h, "MXNDArrayGetData");
			*(void **)&mx.shallow_copy = dlsym(h, "MXShallowCopyNDArray");
			*(void **)&mx.free_nd = dlsym(h, "MXNDArrayFree");
			if (!mx.push || !mx.get_data || !mx.shallow_copy || !mx.free_nd)
				st = KOLO_EUNSUPPORTED;
			else
				mx.bound = 1;
			dlclose(h); /* the process keeps its own reference */
		}
	}
	pthread_mutex_unlock(&mx.lock);
	return st;
}

static void record_error(kolo_status_t st, const struct mx_op *o)
{
	pthread_mutex_lock(&mx.lock);
	if (mx.err == KOLO_OK) {
		mx.err = st;
		const char *detail = o->comm ? kolo_last_error(o->comm) : "";
		snprintf(mx.err_msg, sizeof mx.err_msg, "%s %s: %s", mx_kind_name[o->kind],
		         o->names[0], detail && detail[0] ? detail : kolo_strerror(st));
	}
	pthread_mutex_unlock(&mx.lock);
}

kolo_status_t kolo_mx_take_error(char *msg, size_t len)
{
	pthread_mutex_lock(&mx.lock);
	kolo_status_t st = mx.err;
	if (msg != NULL && len > 0)
		snprintf(msg, len, "%s", st == KOLO_OK ? "" : mx.err_msg);
	mx.err = KOLO_OK;
	mx.err_msg[0] = '\0';
	pthread_mutex_unlock(&mx.lock);
	return st;
}

int kolo_mx_pending(void)
{
	return atomic_load(&mx_pending);
}

static void op_free(void *param)
{
	struct mx_op *o = param;
	for (int i = 0; i < o->n; i++) {
		if (o->in && o->in[i])
			mx.free_nd(o->in[i]);
		if (o->out && o->out[i] && (o->in == NULL || o->out[i] != o->in[i]))
			mx.free_nd(o->out[i]);
		if (o->names)
			free(o->names[i]);
	}
	if (o->token)
		mx.free_nd(o->token);
	free(o->names);
	free(o->rw);
	free(o->data);
	free(o->in);
	free(o->out);
	free(o->counts);
	free(o->gathered);
	free(o);
}

/* kolo's engine thread: the collective is done; so is the MXNet operation.
 * MXNet may free the op (op_free) inside fn: nothing touches it after. */
static void op_complete(void *arg, kolo_status_t st)
{
	struct mx_op *o = arg;
	if (st != KOLO_OK)
		record_error(st, o);
	struct mx_on_complete done = o->done;
	atomic_fetch_sub(&mx_pending, 1);
	done.fn(done.engine, done.param, NULL);
}

/* The first element of this rank's share of an array of count elements
 * (kolo_reducescatter_count's split), and the share's length. */
static size_t share_of(kolo_comm_t *comm, size_t count, size_t *len)
{
	int size = kolo_size(comm), rank = kolo_rank(comm);
	size_t off = 0;
	for (int r = 0; r < rank; r++)
		off += kolo_reducescatter_count(count, size, r);
	*len = kolo_reducescatter_count(count, size, rank);
	return off;
}

/* The in-place reducescatter and allgather on an array's memory: the share
 * sits at its own offset in the array, as a ZeRO-style update wants it. */
static kolo_status_t run_share(struct mx_op *o, void *array)
{
	size_t len, off = share_of(o->comm, o->counts[0], &len);
	char *share = (char *)array + off * kolo_dtype_size(o->dtype);
	if (o->kind == MX_REDUCESCATTER)
		return kolo_reducescatter_async(o->comm, o->names[0], array, share, o->counts[0],
		                                o->dtype, o->op, o->pre, o->post, op_complete, o,
		                                NULL);
	return kolo_allgather_into_async(o->comm, o->names[0], share, len, o->dtype, array,
	                                 o->counts[0], o->gathered, op_complete, o, NULL);
}

/* MXNet's engine thread: the inputs are ready and nobody else writes the
 * outputs; enqueue the collective on the arrays' memory and return. */
static void op_run(void *run_ctx, void *on_complete, void *param)
{
	(void)run_ctx;
	struct mx_op *o = param;
	memcpy(&o->done, on_complete, sizeof o->done);
	void **in = o->data, **out = o->data + o->n;
	kolo_status_t st = KOLO_OK;
	for (int i = 0; i < o->n && st == KOLO_OK; i++) {
		if (mx.get_data(o->in[i], &in[i]) != 0 || mx.get_data(o->out[i], &out[i]) != 0)
			st = KOLO_EINVAL;
	}
	if (st == KOLO_OK && o->kind == MX_BROADCAST)
		st = kolo_broadcast_async(o->comm, o->names[0], out[0], o->counts[0], o->dtype,
		                          o->root, op_complete, o, NULL);
	else if (st == KOLO_OK && (o->kind == MX_REDUCESCATTER || o->kind == MX_ALLGATHER))
		st = run_share(o, out[0]);
	else if (st == KOLO_OK && o->n == 1)
		st = kolo_allreduce_async(o->comm, o->names[0], in[0], out[0], o->counts[0],
		                          o->dtype, o->op, o->pre, o->post, op_complete, o, NULL);
	else if (st == KOLO_OK)
		st = kolo_grouped_allreduce_async(o->comm, o->n, (const char *const *)o->names,
		                                  (const void *const *)in, out, o->counts, o->dtype,
		                                  o->op, o->pre, o->post, op_complete, o, NULL);
	if (st != KOLO_OK)
		op_complete(o, st); /* not enqueued: its callback never comes */
}

static struct mx_op *op_new(enum mx_kind kind, kolo_comm_t *comm, int n, const char *const *names,
                            void *const *inputs, void *const *outputs, const size_t *counts,
                            void *token)
{
	struct mx_op *o = calloc(1, sizeof *o);
	if (o == NULL)
		return NULL;
	o->kind = kind;
	o->comm = comm;
	o->n = n;
	o->names = calloc((size_t)n, sizeof *o->names);
	o->in = calloc((size_t)n, sizeof *o->in);
	o->out = calloc((size_t)n, sizeof *o->out);
	o->counts = calloc((size_t)n, sizeof *o->counts);
	o->rw = calloc(2 * (size_t)n + 1, sizeof *o->rw);
	o->data = calloc(2 * (size_t)n, sizeof *o->data);
	if (!o->names || !o->in || !o->out || !o->counts || !o->rw || !o->data)
		goto fail;
	if (token != NULL && mx.shallow_copy(token, &o->token) != 0)
		goto fail;
	for (int i = 0; i < n; i++) {
		o->counts[i] = counts[i];
		o->names[i] = strdup(names[i]);
		if (o->names[i] == NULL || mx.shallow_copy(inputs[i], &o->in[i]) != 0)
			goto fail;
		if (outputs[i] == inputs[i])
			o->out[i] = o->in[i];
		else if (mx.shallow_copy(outputs[i], &o->out[i]) != 0)
			goto fail;
	}
	return o;
fail:
	op_free(o);
	return NULL;
}

/* Pushes o: inputs that are not also outputs are read, outputs and the
 * name's token written (so the engine runs one name's operations in the
 * order they were pushed: they must reach kolo in the same order on every
 * rank, and a name is free again only once its operation completed). */
static kolo_status_t op_push(struct mx_op *o, int priority)
{
	int nw = o->n + (o->token != NULL);
	void **writes = o->rw, **reads = o->rw + nw;
	int nr = 0;
	for (int i = 0; i < o->n; i++) {
		writes[i] = o->out[i];
		if (o->in[i] != o->out[i])
			reads[nr++] = o->in[i];
	}
	if (o->token != NULL)
		writes[o->n] = o->token;
	atomic_fetch_add(&mx_pending, 1);
	if (mx.push(op_run, o, op_free, (void *)&mx_cpu, reads, nr, writes, nw, NULL, priority,
	            mx_opr_name[o->kind], false) != 0) {
		atomic_fetch_sub(&mx_pending, 1);
		op_free(o);
		return KOLO_EINVAL;
	}
	return KOLO_OK;
}

static kolo_status_t check_common(kolo_comm_t *comm, int n, const char *const *names,
                                  void *const *arrays, kolo_dtype_t dtype)
{
	if (!mx.bound)
		return KOLO_EUNSUPPORTED;
	if (comm == NULL || n < 1 || names == NULL || arrays == NULL || (int)dtype < 0 ||
	    dtype >= KOLO_DTYPE_COUNT)
		return KOLO_EINVAL;
	for (int i = 0; i < n; i++)
		if (names[i] == NULL || names[i][0] == '\0' || arrays[i] == NULL)
			return KOLO_EINVAL;
	return KOLO_OK;
}

/* Sets o's reduction and pushes it. */
static kolo_status_t push_reduction(struct mx_op *o, kolo_op_t op, double pre, double post,
                                    int priority)
{
	o->op = op;
	o->pre = pre;
	o->post = post;
	return op_push(o, priority);
}

kolo_status_t kolo_mx_allreduce(kolo_comm_t *comm, int n, const char *const *names,
                                void *const *inputs, void *const *outputs, const size_t *counts,
                                kolo_dtype_t dtype, kolo_op_t op, double prescale, double postscale,
                                int priority, void *token)
{
	kolo_status_t st = check_common(comm, n, names, inputs, dtype);
	if (st != KOLO_OK)
		return st;
	if (outputs == NULL || counts == NULL || (int)op < 0 ||
	    (op >= KOLO_OP_COUNT && op != KOLO_ADASUM))
		return KOLO_EINVAL;
	for (int i = 0; i < n; i++)
		if (outputs[i] == NULL)
			return KOLO_EINVAL;
	struct mx_op *o = op_new(MX_ALLREDUCE, comm, n, names, inputs, outputs, counts, token);
	if (o == NULL)
		return KOLO_ENOMEM;
	o->dtype = dtype;
	return push_reduction(o, op, prescale, postscale, priority);
}

/* The operation of one array, in place, once the common checks passed. */
static kolo_status_t single_new(enum mx_kind kind, kolo_comm_t *comm, const char *name, void *array,
                                size_t count, kolo_dtype_t dtype, void *token, struct mx_op **out)
{
	void *arrays[1] = {array};
	kolo_status_t st = check_common(comm, 1, &name, arrays, dtype);
	if (st != KOLO_OK)
		return st;
	if ((*out = op_new(kind, comm, 1, &name, arrays, arrays, &count, token)) == NULL)
		return KOLO_ENOMEM;
	(*out)->dtype = dtype;
	return KOLO_OK;
}

kolo_status_t kolo_mx_broadcast(kolo_comm_t *comm, const char *name, void *array, size_t count,
                                kolo_dtype_t dtype, int root, int priority, void *token)
{
	struct mx_op *o = NULL;
	kolo_status_t st = single_new(MX_BROADCAST, comm, name, array, count, dtype, token, &o);
	if (st != KOLO_OK)
		return st;
	if (root < 0 || root >= kolo_size(comm)) {
		op_free(o);
		return KOLO_EINVAL;
	}
	o->root = root;
	return op_push(o, priority);
}

kolo_status_t kolo_mx_reducescatter(kolo_comm_t *comm, const char *name, void *array, size_t count,
                                    kolo_dtype_t dtype, kolo_op_t op, double prescale,
                                    double postscale, int priority, void *token)
{
	if ((int)op < 0 || op >= KOLO_OP_COUNT)
		return KOLO_EINVAL;
	struct mx_op *o = NULL;
	kolo_status_t st = single_new(MX_REDUCESCATTER, comm, name, array, count, dtype, token, &o);
	return st != KOLO_OK ? st : push_reduction(o, op, prescale, postscale, priority);
}

kolo_status_t kolo_mx_allgather(kolo_comm_t *comm, const char *name, void *array, size_t count,
                                kolo_dtype_t dtype, int priority, void *token)
{
	struct mx_op *o = NULL;
	kolo_status_t st = single_new(MX_ALLGATHER, comm, name, array, count, dtype, token, &o);
	if (st != KOLO_OK)
		return st;
	o->gathered = calloc((size_t)kolo_size(comm), sizeof *o->gathered);
	if (o->gathered == NULL) {
		op_free(o);
		return KOLO_ENOMEM;
	}
	return op_push(o, priority);
}
