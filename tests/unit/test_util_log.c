/* Tests for util/log's line format: every stderr line carries an RFC 3339
 * time with milliseconds, the level, the pid, the role, the module and the
 * ids it concerns; ECT_LOG_FORMAT=json gives one JSON object a line; a bad
 * ECT_LOG or ECT_LOG_FORMAT is said once; a handler gets the same fields.
 * Each scenario runs in a child process (the environment is read once per
 * process) whose stderr goes to a file the parent reads back. */
#include <fcntl.h>
#include <jansson.h>
#include <regex.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include "testutil.h"
#include "util/util.h"

/* Runs fn in a child with the given environment; returns its stderr. */
static char *run_child(void (*fn)(void), const char *log, const char *format) {
    char path[] = "/tmp/ect_test_log_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        if (log)
            setenv("ECT_LOG", log, 1);
        else
            unsetenv("ECT_LOG");
        if (format)
            setenv("ECT_LOG_FORMAT", format, 1);
        else
            unsetenv("ECT_LOG_FORMAT");
        dup2(fd, STDERR_FILENO);
        fn();
        _exit(0);
    }
    int st = 0;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    off_t n = lseek(fd, 0, SEEK_END);
    char *buf = calloc(1, (size_t)n + 1);
    assert_int_equal(pread(fd, buf, (size_t)n, 0), n);
    close(fd);
    unlink(path);
    return buf;
}

static void lines(void) {
    ect_log_set_role("tester");
    ECT_LOGW_ID("rsv", "t-1", "h-1", "hello %d", 5);
    ect_log(ECT_LOG_ERROR, "pool", "plain \"quoted\"\nsecond");
    ECT_LOGI("pool", "info shows at ECT_LOG=info");
    ECT_LOGD("pool", "debug does not");
    ECT_LOGW_ID("rsv", "has space", NULL, "odd id");
}

static void assert_matches(const char *text, const char *re) {
    regex_t rx;
    assert_int_equal(regcomp(&rx, re, REG_EXTENDED | REG_NEWLINE), 0);
    int rc = regexec(&rx, text, 0, NULL, 0);
    regfree(&rx);
    if (rc) fail_msg("no line matches %s in:\n%s", re, text);
}

#define TIME "^[0-9]{4}-[01][0-9]-[0-3][0-9]T[0-2][0-9]:[0-5][0-9]:[0-6][0-9]\\.[0-9]{3}Z "

static void test_text_lines(void **state) {
    (void)state;
    char *out = run_child(lines, "info", NULL);
    char re[256];
    assert_matches(out, TIME "warn pid=[0-9]+ role=tester module=rsv transfer_id=t-1 mm_hash=h-1: "
                             "hello 5$");
    assert_matches(out,
                   TIME "error pid=[0-9]+ role=tester module=pool: plain \"quoted\"\\\\nsecond$");
    assert_matches(out,
                   TIME "info pid=[0-9]+ role=tester module=pool: info shows at ECT_LOG=info$");
    assert_matches(out, TIME "warn pid=[0-9]+ role=tester module=rsv transfer_id=\"has space\": "
                             "odd id$");
    assert_null(strstr(out, "debug does not"));
    snprintf(re, sizeof re, "pid=%d ", (int)getpid());
    assert_null(strstr(out, re)); /* the child's pid, not ours */
    free(out);
}

static void test_json_lines(void **state) {
    (void)state;
    char *out = run_child(lines, "info", "json");
    int n = 0;
    for (char *save = NULL, *l = strtok_r(out, "\n", &save); l; l = strtok_r(NULL, "\n", &save)) {
        json_error_t e;
        json_t *o = json_loads(l, 0, &e);
        if (!o) fail_msg("not one JSON object a line: %s (%s)", l, e.text);
        const char *t = json_string_value(json_object_get(o, "time"));
        assert_non_null(t);
        assert_matches(t, TIME "?");
        assert_true(json_integer_value(json_object_get(o, "pid")) > 0);
        assert_string_equal(json_string_value(json_object_get(o, "role")), "tester");
        const char *msg = json_string_value(json_object_get(o, "message"));
        if (n == 0) {
            assert_string_equal(json_string_value(json_object_get(o, "level")), "warn");
            assert_string_equal(json_string_value(json_object_get(o, "module")), "rsv");
            assert_string_equal(json_string_value(json_object_get(o, "transfer_id")), "t-1");
            assert_string_equal(json_string_value(json_object_get(o, "mm_hash")), "h-1");
            assert_string_equal(msg, "hello 5");
        } else if (n == 1) {
            assert_null(json_object_get(o, "transfer_id"));
            assert_string_equal(msg, "plain \"quoted\"\nsecond"); /* one line, escaped */
        }
        json_decref(o);
        n++;
    }
    assert_int_equal(n, 4);
    free(out);
}

static void bad_env(void) {
    ECT_LOGW("pool", "first");
    ECT_LOGI("pool", "info is off: the default level is warn");
    ect_log_set_level(-1); /* reads ECT_LOG again: still said only once */
    ECT_LOGW("pool", "second");
}

static void test_bad_env_said_once(void **state) {
    (void)state;
    char *out = run_child(bad_env, "verbose", "xml");
    const char *a = strstr(out, "ECT_LOG='verbose' is not a level (error, warn, info or debug)");
    assert_non_null(a);
    assert_null(strstr(a + 1, "ECT_LOG='verbose'"));
    const char *b = strstr(out, "ECT_LOG_FORMAT='xml' is not text or json; using text");
    assert_non_null(b);
    assert_null(strstr(b + 1, "ECT_LOG_FORMAT='xml'"));
    assert_matches(out, TIME "warn pid=[0-9]+ role=[^ ]+ module=pool: first$");
    assert_matches(out, TIME "warn pid=[0-9]+ role=[^ ]+ module=pool: second$");
    assert_null(strstr(out, "info is off"));
    free(out);
}

typedef struct seen {
    char tid[64], hash[64], role[64], msg[64];
    uint64_t pid;
    int n;
} seen;

static void on_line(void *user, const ect_log_record *r) {
    seen *s = user;
    s->n++;
    snprintf(s->tid, sizeof s->tid, "%s", r->transfer_id ? r->transfer_id : "(null)");
    snprintf(s->hash, sizeof s->hash, "%s", r->mm_hash ? r->mm_hash : "(null)");
    snprintf(s->role, sizeof s->role, "%s", r->role);
    snprintf(s->msg, sizeof s->msg, "%s", r->message);
    s->pid = r->pid;
}

static void test_handler_gets_fields(void **state) {
    (void)state;
    seen s = {0};
    ect_log_set_handler(on_line, &s);
    ect_log_set_role("worker-7");
    ECT_LOGE_ID("rsv", "tid-9", NULL, "gone");
    assert_int_equal(s.n, 1);
    assert_string_equal(s.tid, "tid-9");
    assert_string_equal(s.hash, "(null)");
    assert_string_equal(s.role, "worker-7");
    assert_string_equal(s.msg, "gone");
    assert_int_equal(s.pid, (uint64_t)getpid());
    ect_log_set_role(NULL);
    ECT_LOGE("rsv", "x");
    assert_string_not_equal(s.role, "worker-7"); /* the program's name again */
    assert_true(s.role[0] != '\0');
    ect_log_set_handler(NULL, NULL);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_text_lines),
        cmocka_unit_test(test_json_lines),
        cmocka_unit_test(test_bad_env_said_once),
        cmocka_unit_test(test_handler_gets_fields),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
