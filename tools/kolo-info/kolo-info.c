/* kolo-info: prints the version, what this build contains, and every KOLO_*
 * parameter with its default, alias, current value and help.
 *
 *   kolo-info                      version, build and parameters
 *   kolo-info --params [--markdown] [--defaults]
 *   kolo-info --cuda               only the CUDA section
 *   kolo-info --libs               only where libkolo and its libraries are
 *
 * --markdown writes the table docs/params.md is made of; --defaults leaves
 * out the current values (what the committed document holds). */
#include <curl/curl.h>
#include <getopt.h>
#include <jansson.h>
#include <limits.h>
#include <link.h>
#include <microhttpd.h>
#include <openssl/crypto.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core.h"
#include "gpu.h"
#include "transport_verbs.h"

static const char *type_name(enum kolo_param_type t)
{
	switch (t) {
	case KOLO_PARAM_INT:
		return "int";
	case KOLO_PARAM_FLOAT:
		return "float";
	case KOLO_PARAM_STRING:
		return "string";
	case KOLO_PARAM_BOOL:
		return "bool";
	}
	return "?";
}

/* The value to show: secrets are never printed. */
static const char *shown_value(enum kolo_param_id id)
{
	if (id == KOLO_P_TOKEN && kolo_param_str(id)[0])
		return "(set, hidden)";
	return kolo_param_str(id);
}

/* Markdown table cell: '|' would end the cell. */
static void md_cell(const char *s)
{
	for (; *s; s++) {
		if (*s == '|')
			fputs("\\|", stdout);
		else
			putchar(*s);
	}
}

static void params_markdown(bool defaults_only)
{
	printf("# Parameters\n\n"
	       "Every `KOLO_*` environment variable kolo reads, generated from `core/params.def` "
	       "by\n`kolo-info --params --markdown --defaults` (do not edit by hand). Aliases are "
	       "Horovod's\nnames for the same setting; the `KOLO_` name wins when both are set. "
	       "Sizes accept\nsuffixes (`64M`, `1G`, `128KiB`); booleans accept `1`, `true`, "
	       "`yes`, "
	       "`on`.\n\n");
	printf("| Variable | Type | Default | Alias | Description |%s\n",
	       defaults_only ? "" : " Current (source) |");
	printf("|---|---|---|---|---|%s\n", defaults_only ? "" : "---|");
	for (int i = 0; i < KOLO_P_COUNT; i++) {
		const struct kolo_param_info *p = kolo_param_info((enum kolo_param_id)i);
		printf("| `%s` | %s | ", p->env, type_name(p->type));
		if (p->def[0]) {
			printf("`");
			md_cell(p->def);
			printf("`");
		}
		printf(" | %s%s%s | ", p->alias[0] ? "`" : "", p->alias, p->alias[0] ? "`" : "");
		md_cell(p->help);
		printf(" |");
		if (!defaults_only) {
			printf(" `");
			md_cell(shown_value((enum kolo_param_id)i));
			printf("` (%s) |", kolo_param_source((enum kolo_param_id)i));
		}
		printf("\n");
	}
}

static void params_text(bool defaults_only)
{
	for (int i = 0; i < KOLO_P_COUNT; i++) {
		enum kolo_param_id id = (enum kolo_param_id)i;
		const struct kolo_param_info *p = kolo_param_info(id);
		printf("%s (%s, default \"%s\"%s%s)\n", p->env, type_name(p->type), p->def,
		       p->alias[0] ? ", alias " : "", p->alias);
		if (!defaults_only)
			printf("    value: \"%s\" (%s)\n", shown_value(id), kolo_param_source(id));
		printf("    %s\n", p->help);
	}
}

/* What the verbs transport would find here. CI runs it against an
 * emulation, which tests the protocol, not a NIC; this reports the real
 * library and devices. */
static void verbs_info(void)
{
	struct kolo_verbs_info vi;
	kolo_verbs_query(&vi);
	if (!vi.loaded) {
		printf("verbs: unavailable: %s\n", vi.why);
		return;
	}
	printf("verbs: libibverbs.so.1 loaded, %d device%s%s%s\n", vi.ndevs,
	       vi.ndevs == 1 ? "" : "s", vi.why[0] ? ": " : "", vi.why);
	for (int i = 0; i < vi.ndevs; i++) {
		const struct kolo_verbs_dev_info *d = &vi.devs[i];
		printf("  %s: %d port%s", d->name, d->nports, d->nports == 1 ? "" : "s");
		for (int p = 0; p < d->nports && p < (int)KOLO_ARRAY_SIZE(d->ports); p++)
			printf("%s port %d %s %s", p ? "," : ";", d->ports[p].port,
			       d->ports[p].roce ? "RoCE" : "InfiniBand",
			       d->ports[p].active ? "active" : "down");
		printf("\n");
	}
	printf("verbs emulation: built in for the tests only (a protocol test double, not a "
	       "NIC); never chosen by KOLO_TRANSPORT\n");
}

/* "13.0" from CUDA's 13000, "2.28.9" from NCCL's 22809 (>= 2.9: 10000 x
 * major + 100 x minor + patch; before: 1000 x major + 100 x minor + patch). */
static const char *cuda_ver(int v, char *buf, size_t size)
{
	snprintf(buf, size, "%d.%d", v / 1000, v % 1000 / 10);
	return buf;
}

static const char *nccl_ver(int v, char *buf, size_t size)
{
	if (v >= 20900)
		snprintf(buf, size, "%d.%d.%d", v / 10000, v % 10000 / 100, v % 100);
	else
		snprintf(buf, size, "%d.%d.%d", v / 1000, v % 1000 / 100, v % 100);
	return buf;
}

/* What kolo would find for device memory here (core/gpu.h): the build, the
 * libraries found at run time, the driver, the GPUs, and what a collective
 * does with a device pointer today. Every line starts with "cuda" or "nccl"
 * so that scripts can cut the section out. */
static void cuda_info(void)
{
	struct kolo_cuda_info ci;
	char a[32], b[32];
	kolo_cuda_query(&ci);
	if (!ci.built) {
		printf("cuda build: without CUDA (KOLO_WITH_CUDA=OFF, or no headers found)\n");
	} else {
		printf("cuda build: CUDA %s headers (CUDART_VERSION %d)",
		       cuda_ver(ci.header_runtime, a, sizeof(a)), ci.header_runtime);
		if (ci.nccl_built)
			printf(", NCCL %s headers (NCCL_VERSION_CODE %d)",
			       nccl_ver(ci.header_nccl, b, sizeof(b)), ci.header_nccl);
		else
			printf(", no NCCL headers");
		printf("; libraries loaded at run time\n");
	}
	if (ci.cudart_path[0])
		printf("cuda runtime: %s, version %s\n", ci.cudart_path,
		       cuda_ver(ci.runtime_version, a, sizeof(a)));
	else
		printf("cuda runtime: none: %s\n", ci.why_cudart);
	if (ci.driver_version)
		printf("cuda driver: version %s\n", cuda_ver(ci.driver_version, a, sizeof(a)));
	else
		printf("cuda driver: none: %s\n", ci.why_driver);
	if (ci.ngpus > 0) {
		printf("cuda devices: %d visible\n", ci.ngpus);
		for (int i = 0; i < ci.ngpus && i < KOLO_CUDA_MAX_GPUS; i++)
			printf("cuda device %d: %s, %.1f GiB, compute capability %d.%d\n", i,
			       ci.gpus[i].name, (double)ci.gpus[i].mem_bytes / (1 << 30),
			       ci.gpus[i].cc_major, ci.gpus[i].cc_minor);
	} else {
		printf("cuda devices: none: %s\n", ci.why_gpus);
	}
	if (ci.nccl_path[0] && ci.nccl_version)
		printf("nccl library: %s, version %s\n", ci.nccl_path,
		       nccl_ver(ci.nccl_version, a, sizeof(a)));
	else
		printf("nccl library: none: %s\n", ci.why_nccl);
	const char *why;
	if (kolo_cuda_devices_visible(&why))
		printf("cuda memory: device pointers are recognised and refused "
		       "(KOLO_EUNSUPPORTED): the device data path is not built yet\n");
	else
		printf("cuda memory: every buffer is host memory: %s\n", why);
}

/* The system libraries libkolo links, as the loader found them: by their
 * names, "libcurl.so.4" or, in a wheel that auditwheel repaired (their
 * copies in kolo.libs/), "libcurl-02fbea31.so.4.8.0". */
static const char *const system_libs[] = {"libmicrohttpd", "libjansson", "libcurl", "libcrypto"};

static int print_system_lib(struct dl_phdr_info *info, size_t size, void *data)
{
	(void)size;
	int *found = data;
	const char *base = strrchr(info->dlpi_name, '/');
	base = base ? base + 1 : info->dlpi_name;
	for (size_t i = 0; i < KOLO_ARRAY_SIZE(system_libs); i++) {
		size_t n = strlen(system_libs[i]);
		if (strncmp(base, system_libs[i], n) == 0 && (base[n] == '.' || base[n] == '-')) {
			printf("%s%s", *found ? ", " : "", info->dlpi_name);
			(*found)++;
		}
	}
	return 0;
}

/* Where this libkolo is and where the libraries it needs came from. Every
 * kolo binary carries libkolo statically. The shared libkolo.so lies in
 * ../lib beside the binaries: in a build tree (build/lib, which the source
 * tree's Python package loads), in a wheel (kolo/lib, which the installed
 * package loads) and in a cmake --install prefix (<prefix>/lib, for
 * programs linked with -lkolo). CUDA, NCCL and libibverbs are opened at run
 * time: the verbs and cuda sections say what was found. */
static void libs_info(void)
{
	char exe[PATH_MAX];
	ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
	if (n <= 0) {
		printf("libkolo: %s, linked into this binary (its path unknown)\n",
		       KOLO_VERSION_STRING);
	} else {
		exe[n] = '\0';
		printf("libkolo: %s, linked into %s\n", KOLO_VERSION_STRING, exe);
		char *slash = strrchr(exe, '/');
		if (slash)
			*slash = '\0';
		char dir[PATH_MAX], lib[PATH_MAX];
		int w = snprintf(dir, sizeof(dir), "%s/../lib", exe);
		if (w > 0 && (size_t)w < sizeof(dir) && realpath(dir, lib) &&
		    strlen(lib) + sizeof("/libkolo.so") <= sizeof(lib)) {
			strcat(lib, "/libkolo.so");
			if (access(lib, R_OK) == 0)
				printf("libkolo.so: %s (beside this binary)\n", lib);
			else
				printf("libkolo.so: none beside this binary (%s)\n", lib);
		} else {
			printf("libkolo.so: none beside this binary (no %s/../lib)\n", exe);
		}
	}
	printf("libraries: libmicrohttpd %s, jansson %s, libcurl %s, OpenSSL %s\n",
	       MHD_get_version(),
#if JANSSON_VERSION_HEX >= 0x020d00
	       jansson_version_str(),
#else
	       JANSSON_VERSION,
#endif
	       curl_version_info(CURLVERSION_NOW)->version,
#ifdef OPENSSL_VERSION_STRING
	       OpenSSL_version(OPENSSL_VERSION_STRING)
#else
	       OpenSSL_version(OPENSSL_VERSION)
#endif
	);
	int found = 0;
	printf("libraries loaded: ");
	dl_iterate_phdr(print_system_lib, &found);
	printf("%s\n", found ? "" : "none found");
}

static void build_info(void)
{
	printf("kolo %s\n", KOLO_VERSION_STRING);
	libs_info();
	printf("transports: tcp (between hosts), shm (between ranks of one host), verbs "
	       "(InfiniBand/RoCE between hosts; not yet run on hardware)\n");
	verbs_info();
	printf("usable cpus: %d (affinity mask, capped by the cgroup CPU quota)\n",
	       kolo_cpu_count());
	cuda_info();
#if defined(__SANITIZE_ADDRESS__)
	printf("sanitizer: address\n");
#elif defined(__SANITIZE_THREAD__)
	printf("sanitizer: thread\n");
#endif
}

static void usage(FILE *f)
{
	fprintf(f, "usage: kolo-info [--params] [--markdown] [--defaults] [--cuda] [--libs] "
	           "[--version] [--help]\n"
	           "  (no option)   version, build contents and every parameter\n"
	           "  --params      only the KOLO_* parameters\n"
	           "  --markdown    the parameters as a Markdown table (docs/params.md)\n"
	           "  --defaults    leave out the current values\n"
	           "  --cuda        only the CUDA/NCCL section: build, libraries, driver, GPUs\n"
	           "  --libs        only where libkolo is and the system libraries it loaded\n"
	           "  --version     only the version\n");
}

int main(int argc, char **argv)
{
	static const struct option longs[] = {
	        {"params", no_argument, NULL, 'p'},   {"markdown", no_argument, NULL, 'm'},
	        {"defaults", no_argument, NULL, 'd'}, {"version", no_argument, NULL, 'v'},
	        {"help", no_argument, NULL, 'h'},     {"cuda", no_argument, NULL, 'c'},
	        {"libs", no_argument, NULL, 'l'},     {NULL, 0, NULL, 0},
	};
	bool params = false, markdown = false, defaults = false;
	int c;
	while ((c = getopt_long(argc, argv, "pmdvhcl", longs, NULL)) != -1) {
		switch (c) {
		case 'p':
			params = true;
			break;
		case 'm':
			markdown = true;
			break;
		case 'd':
			defaults = true;
			break;
		case 'v':
			printf("kolo %s\n", KOLO_VERSION_STRING);
			return 0;
		case 'h':
			usage(stdout);
			return 0;
		case 'c':
			cuda_info();
			return 0;
		case 'l':
			libs_info();
			return 0;
		default:
			usage(stderr);
			return 2;
		}
	}
	if (optind < argc) {
		usage(stderr);
		return 2;
	}
	if (markdown) {
		params_markdown(defaults);
		return 0;
	}
	if (!params) {
		build_info();
		printf("\nparameters:\n");
	}
	params_text(defaults);
	return 0;
}
