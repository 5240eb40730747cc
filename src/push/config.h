/*
 * config — the push roles' JSON configurations (ect_push_*_open_config):
 * which keys of the shared vocabulary (util/jconf.h) each role reads and how
 * they fill its options struct. Pure; the fuzz target and the unit tests
 * call these directly.
 */
#ifndef ECT_PUSH_CONFIG_H
#define ECT_PUSH_CONFIG_H

#include <jansson.h>

#include "ectransfer.h"

/* Each fills *o from its _opts_init defaults and the keys of `json`; the
 * strings of *o point into *root, which the caller json_decrefs after
 * opening (also on failure). Returns 0 or ECT_EINVAL naming the key. */
int push_consumer_config(const char *json, ect_push_consumer_opts *o, json_t **root);
int push_scheduler_config(const char *json, ect_push_scheduler_opts *o, json_t **root);
int push_producer_config(const char *json, ect_push_producer_opts *o, json_t **root);

#endif
