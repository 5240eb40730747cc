/* demo_line — see demo_line.h. */
#include "cli/demo_line.h"

#include <stdlib.h>
#include <string.h>

static const char *skip_ws(const char *p) {
    while (*p == ' ' || *p == '\t' || *p == '\r' || *p == '\n') p++;
    return p;
}

static bool is_digit(char c) { return c >= '0' && c <= '9'; }

/* A string of printable ASCII without escapes at p ('"'): its end (the
 * closing quote), or NULL (other bytes: jansson checks UTF-8). */
static const char *scan_plain_string(const char *p) {
    for (p++; *p != '"'; p++)
        if (*p == '\\' || *p < 0x20 || *p > 0x7e) return NULL;
    return p;
}

/* Digits at p, at most max of them: the first byte after, or NULL. */
static const char *scan_digits(const char *p, int max) {
    const char *s = p;
    while (is_digit(*p)) p++;
    return p > s && p - s <= max ? p : NULL;
}

/* A JSON number at p: an integer of at most 15 digits (exact as a double,
 * within int64), or a real (a fraction or an exponent) of at most 24 digits
 * and a 2-digit exponent (never out of a double's range; jansson and
 * demo_line_num both read it with strtod, so to the same double: jansson
 * prints a real with 17 significant digits, e.g. `ect push`'s latency_ms):
 * the first byte after it, or NULL. */
static const char *scan_number(const char *p) {
    if (*p == '-') p++;
    if (p[0] == '0' && is_digit(p[1])) return NULL; /* no leading zeros */
    const char *s = p;
    if (!(p = scan_digits(p, 24))) return NULL;
    bool real = *p == '.' || *p == 'e' || *p == 'E';
    if (*p == '.' && !(p = scan_digits(p + 1, 24 - (int)(p - s)))) return NULL;
    if (*p == 'e' || *p == 'E') {
        p++;
        if (*p == '+' || *p == '-') p++;
        if (!(p = scan_digits(p, 2))) return NULL;
    }
    if (!real && p - s > 15) return NULL;
    return p;
}

/* An array of numbers at p ('['): the first byte after it, or NULL. */
static const char *scan_number_array(const char *p) {
    p = skip_ws(p + 1);
    if (*p == ']') return p + 1;
    for (;;) {
        if (!(p = scan_number(p))) return NULL;
        p = skip_ws(p);
        if (*p == ']') return p + 1;
        if (*p != ',') return NULL;
        p = skip_ws(p + 1);
    }
}

/* One value at p: its kind, [*vs, *ve) its text, the first byte after it. */
static const char *scan_value(const char *p, char *kind, const char **vs, const char **ve) {
    static const char *const lits[] = {"true", "false", "null"};
    *vs = p;
    if (*p == '"') {
        const char *e = scan_plain_string(p);
        *kind = 's';
        *vs = p + 1;
        *ve = e;
        return e ? e + 1 : NULL;
    }
    if (*p == '[') {
        *kind = 'o';
        return *ve = scan_number_array(p);
    }
    for (size_t i = 0; i < 3; i++)
        if (!strncmp(p, lits[i], strlen(lits[i]))) {
            *kind = 'o';
            return *ve = p + strlen(lits[i]);
        }
    *kind = 'n';
    return *ve = scan_number(p);
}

/* The in-place reading: validates the whole line first, then cuts it. */
static bool parse_in_place(char *line, demo_line *l) {
    const char *ks[DEMO_LINE_MAX_FIELDS], *ke[DEMO_LINE_MAX_FIELDS];
    const char *vs[DEMO_LINE_MAX_FIELDS], *ve[DEMO_LINE_MAX_FIELDS];
    int n = 0;
    const char *p = skip_ws(line);
    if (*p++ != '{') return false;
    p = skip_ws(p);
    if (*p != '}') {
        for (;;) {
            if (n == DEMO_LINE_MAX_FIELDS || *p != '"' || !(ke[n] = scan_plain_string(p)))
                return false;
            ks[n] = p + 1;
            for (int i = 0; i < n; i++) /* a repeated key: jansson's last one wins */
                if (ke[i] - ks[i] == ke[n] - ks[n] &&
                    !memcmp(ks[i], ks[n], (size_t)(ke[n] - ks[n])))
                    return false;
            p = skip_ws(ke[n] + 1);
            if (*p++ != ':') return false;
            p = skip_ws(p);
            if (!(p = scan_value(p, &l->kind[n], &vs[n], &ve[n]))) return false;
            n++;
            p = skip_ws(p);
            if (*p == '}') break;
            if (*p++ != ',') return false;
            p = skip_ws(p);
        }
    }
    if (*skip_ws(p + 1) != '\0') return false;
    for (int i = 0; i < n; i++) { /* every cut lands on a quote, ',', '}' or ws */
        line[ke[i] - line] = '\0';
        line[ve[i] - line] = '\0';
        l->key[i] = ks[i];
        l->val[i] = vs[i];
    }
    l->n = n;
    l->o = NULL;
    return true;
}

bool demo_line_parse(char *line, demo_line *l) {
    memset(l, 0, sizeof *l);
    if (parse_in_place(line, l)) return true;
    l->o = json_loads(line, 0, NULL);
    if (l->o && !json_is_object(l->o)) {
        json_decref(l->o);
        l->o = NULL;
    }
    return l->o != NULL;
}

void demo_line_free(demo_line *l) {
    json_decref(l->o);
    l->o = NULL;
}

static int find(const demo_line *l, const char *key) {
    for (int i = 0; i < l->n; i++)
        if (!strcmp(l->key[i], key)) return i;
    return -1;
}

const char *demo_line_str(const demo_line *l, const char *key) {
    if (l->o) {
        const char *s = json_string_value(json_object_get(l->o, key));
        return s ? s : "";
    }
    int i = find(l, key);
    return i >= 0 && l->kind[i] == 's' ? l->val[i] : "";
}

double demo_line_num(const demo_line *l, const char *key) {
    if (l->o) return json_number_value(json_object_get(l->o, key));
    int i = find(l, key);
    return i >= 0 && l->kind[i] == 'n' ? strtod(l->val[i], NULL) : 0;
}

int64_t demo_line_int(const demo_line *l, const char *key) {
    if (l->o) return (int64_t)json_integer_value(json_object_get(l->o, key));
    int i = find(l, key);
    if (i < 0 || l->kind[i] != 'n' || strpbrk(l->val[i], ".eE")) return 0;
    return strtoll(l->val[i], NULL, 10);
}
