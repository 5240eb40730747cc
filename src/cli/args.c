/* args — flag value parsing shared by every command. */
#include <ctype.h>
#include <getopt.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "cli/cli.h"
#include "ectransfer.h"

const char *cli_command = "";

void cli_set_command(const char *name) { cli_command = name ? name : ""; }

/* "ect CMD: " before a flag's error, so every number-parsing error names the
 * command as well as the flag. */
static void flag_prefix(void) {
    if (*cli_command)
        fprintf(stderr, "ect %s: ", cli_command);
    else
        fprintf(stderr, "ect: ");
}

int cli_usage_error(const char *cmd, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "ect %s: ", cmd);
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\ntry 'ect %s --help'\n", cmd);
    va_end(ap);
    return CLI_EXIT_USAGE;
}

int cli_bad_flag(const char *cmd, const struct option *opts) {
    /* getopt_long has already said which flag was wrong (unknown, or missing
     * its value); add what is accepted. */
    fprintf(stderr, "ect %s: accepted flags:", cmd);
    for (const struct option *o = opts; o->name; o++)
        fprintf(stderr, " --%s%s", o->name, o->has_arg == required_argument ? " VALUE" : "");
    fprintf(stderr, "\ntry 'ect %s --help'\n", cmd);
    return CLI_EXIT_USAGE;
}

bool cli_parse_u64(const char *flag, const char *s, uint64_t min, uint64_t max, uint64_t *out) {
    char *end;
    errno = 0;
    if (!s || !isdigit((unsigned char)*s)) goto bad;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || *end || v < min || v > max) goto bad;
    *out = v;
    return true;
bad:
    flag_prefix();
    fprintf(stderr, "%s: '%s' is not an integer in [%" PRIu64 ", %" PRIu64 "]\n", flag, s ? s : "",
            min, max);
    return false;
}

bool cli_parse_size(const char *flag, const char *s, uint64_t *out) {
    static const struct {
        const char *suffix;
        double mult;
    } units[] = {
        {"", 1},       {"b", 1},        {"k", 0x1p10},   {"kib", 0x1p10}, {"kb", 1e3},
        {"m", 0x1p20}, {"mib", 0x1p20}, {"mb", 1e6},     {"g", 0x1p30},   {"gib", 0x1p30},
        {"gb", 1e9},   {"t", 0x1p40},   {"tib", 0x1p40}, {"tb", 1e12},
    };
    char *end;
    if (!s || !(isdigit((unsigned char)*s) || *s == '.')) goto bad;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || !isfinite(v) || v < 0) goto bad;
    while (*end == ' ') end++;
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++) {
        if (strcasecmp(end, units[i].suffix) == 0) {
            double bytes = v * units[i].mult;
            if (bytes >= 0x1p63 || bytes != floor(bytes)) goto bad;
            *out = (uint64_t)bytes;
            return true;
        }
    }
bad:
    flag_prefix();
    fprintf(stderr,
            "%s: '%s' is not a size; use a whole number of bytes or forms like 64KiB, 4.5MiB, "
            "1GiB, 2GB\n",
            flag, s ? s : "");
    return false;
}

bool cli_parse_hostport(const char *flag, const char *s, char *host, size_t hostcap, int *port) {
    if (!ect_hostport_parse(flag, s, 0, 65535, host, hostcap, port)) return true;
    flag_prefix();
    fprintf(stderr, "%s (e.g. 127.0.0.1:14579)\n", ect_last_error());
    return false;
}

const char *cli_fmt_size(uint64_t bytes, char *buf, size_t cap) {
    static const char *unit[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double v = (double)bytes;
    int u = 0;
    while (v >= 1024 && u < 4) {
        v /= 1024;
        u++;
    }
    if (u == 0)
        snprintf(buf, cap, "%" PRIu64 " B", bytes);
    else
        snprintf(buf, cap, "%.4g %s", v, unit[u]);
    return buf;
}

bool cli_have_transport(const char *kind) {
    const char *list = ect_build_info("transports");
    size_t n = strlen(kind);
    for (const char *p = list; p && *p;) {
        const char *e = strchr(p, ' ');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        if (len == n && strncmp(p, kind, n) == 0) return true;
        p = e ? e + 1 : p + len;
    }
    return false;
}

int cli_duration_ms(const char *s, double bare_ms, double *out_ms) {
    static const struct {
        const char *suffix;
        double ms;
    } units[] = {{"us", 1e-3}, {"ms", 1}, {"s", 1e3}, {"m", 60e3}, {"h", 3600e3}};
    char *end;
    if (!s || !(isdigit((unsigned char)*s) || *s == '.')) return -1;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || !isfinite(v) || v < 0) return -1;
    if (!*end) {
        *out_ms = v * bare_ms;
        return 0;
    }
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++) {
        if (strcmp(end, units[i].suffix) == 0) {
            *out_ms = v * units[i].ms;
            return 0;
        }
    }
    return -1;
}

static void fmt_ms(double ms, char *buf, size_t cap) {
    if (ms >= 1000 && fmod(ms, 1000) == 0)
        snprintf(buf, cap, "%gs", ms / 1000);
    else
        snprintf(buf, cap, "%gms", ms);
}

bool cli_parse_duration(const char *flag, const char *s, double bare_ms, double min_ms,
                        double max_ms, double *out_ms) {
    double v;
    char lo[32], hi[32];
    fmt_ms(min_ms, lo, sizeof lo);
    fmt_ms(max_ms, hi, sizeof hi);
    if (cli_duration_ms(s, bare_ms, &v) != 0) {
        flag_prefix();
        fprintf(stderr,
                "%s: '%s' is not a duration; use 500ms, 30s, 2m, 1h (a bare number is %s)\n", flag,
                s ? s : "", bare_ms == 1 ? "milliseconds" : "seconds");
        return false;
    }
    if (!(v >= min_ms && v <= max_ms)) {
        flag_prefix();
        fprintf(stderr, "%s: '%s' is outside %s..%s\n", flag, s, lo, hi);
        return false;
    }
    *out_ms = v;
    return true;
}

bool cli_parse_duration_u64(const char *flag, const char *s, double bare_ms, uint64_t min_ms,
                            uint64_t max_ms, uint64_t *out_ms) {
    double v;
    if (!cli_parse_duration(flag, s, bare_ms, (double)min_ms, (double)max_ms, &v)) return false;
    *out_ms = (uint64_t)ceil(v);
    return true;
}

bool cli_parse_seconds(const char *cmd, const char *s, double min, double max, double *out) {
    (void)cmd;
    double ms;
    if (!cli_parse_duration("--seconds", s, 1000, min * 1000, max * 1000, &ms)) return false;
    *out = ms / 1000;
    return true;
}

void cli_json_num(double v) {
    if (isfinite(v))
        printf("%.17g", v);
    else
        printf("null");
}
