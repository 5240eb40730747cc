/*
 * fuzz_config — feeds arbitrary text to the JSON configuration of every
 * role (push consumer, scheduler, producer; pull producer, scheduler,
 * consumer). Each must either refuse it with ECT_EINVAL and a non-empty
 * sentence, or accept it; an accepted string option must be a NUL-terminated
 * string of the parsed tree, and the tree is always freed.
 * Seeds: fuzz/corpus/config/.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pull/config.h"
#include "push/config.h"
#include "util/util.h"

#define CHECK(cond)                                                                                \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "%s:%d: check failed: %s (%s)\n", __FILE__, __LINE__, #cond,           \
                    ect_last_error());                                                             \
            abort();                                                                               \
        }                                                                                          \
    } while (0)

static void outcome(int rc, json_t *root) {
    CHECK(rc == 0 || (rc == ECT_EINVAL && ect_last_error()[0]));
    json_decref(root);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *text = malloc(size + 1);
    if (!text) return 0;
    memcpy(text, data, size);
    text[size] = '\0';
    json_t *root;
    char addr[PULL_CONFIG_ADDR_MAX];
    ect_push_consumer_opts a;
    int rc = push_consumer_config(text, &a, &root);
    if (!rc) CHECK(strlen(a.ec_ip) <= 255 && strlen(a.transport) <= 15);
    outcome(rc, root);
    ect_push_scheduler_opts b;
    rc = push_scheduler_config(text, &b, &root);
    if (!rc) CHECK(b.consumer_port >= 1 && b.consumer_port <= 65535 && b.push_wait_ms >= 1);
    outcome(rc, root);
    ect_push_producer_opts c;
    rc = push_producer_config(text, &c, &root);
    if (!rc) CHECK(c.control_timeout_ms >= 1 && strlen(c.listen_host) <= 255);
    outcome(rc, root);
    ect_pull_producer_opts d;
    outcome(pull_producer_config(text, &d, &root), root);
    ect_pull_scheduler_opts e;
    rc = pull_scheduler_config(text, &e, &root, addr);
    if (!rc) CHECK(strlen(e.producer) < PULL_CONFIG_ADDR_MAX);
    outcome(rc, root);
    ect_pull_consumer_opts f;
    outcome(pull_consumer_config(text, &f, &root, addr), root);
    free(text);
    return 0;
}
