/*
 * thread_cpu — the CPU time of this process's threads over intervals, summed
 * by thread name (`ect bench push --threads`). A snapshot reads, for every
 * task in /proc/self/task, its name (comm) and the first field of its
 * schedstat (nanoseconds on a CPU); an interval's share is the sum of the
 * differences by task id. A task born during an interval counts from zero; one
 * that ended during it is lost (lanes end after seconds of idleness, not in a
 * busy round).
 */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"

/* The first line of path into buf (no newline); false when unreadable. */
static bool read_line(const char *path, char *buf, size_t cap) {
    FILE *f = fopen(path, "r");
    if (!f) return false;
    bool ok = fgets(buf, (int)cap, f) != NULL;
    fclose(f);
    if (ok) buf[strcspn(buf, "\n")] = 0;
    return ok;
}

bool cli_thr_snap_take(cli_thr_snap *s) {
    s->n = 0;
    DIR *d = opendir("/proc/self/task");
    if (!d) return false;
    for (struct dirent *de; (de = readdir(d)) && s->n < CLI_THR_MAX;) {
        char *end;
        long tid = strtol(de->d_name, &end, 10);
        if (de->d_name[0] == '.' || *end || tid <= 0) continue;
        char path[64], line[64];
        cli_thr *t = &s->t[s->n];
        snprintf(path, sizeof path, "/proc/self/task/%ld/schedstat", tid);
        if (!read_line(path, line, sizeof line)) continue; /* ended meanwhile */
        t->ns = strtoull(line, NULL, 10);
        snprintf(path, sizeof path, "/proc/self/task/%ld/comm", tid);
        if (!read_line(path, t->name, sizeof t->name)) continue;
        t->tid = tid;
        s->n++;
    }
    closedir(d);
    return s->n > 0;
}

void cli_thr_acc_add(cli_thr_acc *a, const cli_thr_snap *before, const cli_thr_snap *after,
                     uint64_t wall_ns) {
    a->wall_ns += wall_ns;
    for (size_t i = 0; i < after->n; i++) {
        const cli_thr *t = &after->t[i];
        uint64_t was = 0;
        for (size_t j = 0; j < before->n; j++)
            if (before->t[j].tid == t->tid) {
                was = before->t[j].ns;
                break;
            }
        if (t->ns <= was) continue;
        size_t k = 0;
        while (k < a->n && strcmp(a->t[k].name, t->name)) k++;
        if (k == a->n) {
            if (a->n == CLI_THR_MAX) continue;
            a->t[a->n++] = (cli_thr){.name = {0}};
            memcpy(a->t[k].name, t->name, sizeof t->name);
        }
        a->t[k].ns += t->ns - was;
    }
}

static int by_ns(const void *x, const void *y) {
    const cli_thr *a = x, *b = y;
    return a->ns < b->ns ? 1 : a->ns > b->ns ? -1 : strcmp(a->name, b->name);
}

void cli_thr_acc_print(cli_thr_acc *a, bool json) {
    qsort(a->t, a->n, sizeof *a->t, by_ns);
    double all = 0;
    for (size_t i = 0; i < a->n; i++) all += (double)a->t[i].ns;
    double wall = a->wall_ns ? (double)a->wall_ns : 1;
    if (json) {
        printf(",\"threads\":{");
        for (size_t i = 0; i < a->n; i++) {
            char name[sizeof a->t[i].name];
            memcpy(name, a->t[i].name, sizeof name);
            for (char *c = name; *c; c++)
                if (*c < 0x20 || *c > 0x7e || *c == '"' || *c == '\\') *c = '?';
            printf("%s\"%s\":", i ? "," : "", name);
            cli_json_num((double)a->t[i].ns / wall);
        }
        printf("}");
        return;
    }
    printf("     threads, share of one CPU over the push rounds: all %.2f:", all / wall);
    for (size_t i = 0; i < a->n && (double)a->t[i].ns / wall >= 0.005; i++)
        printf("%s %s %.2f", i ? "," : "", a->t[i].name, (double)a->t[i].ns / wall);
    printf("\n");
}
