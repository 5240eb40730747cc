/*
 * config — the pull roles' JSON configurations (ect_pull_*_open_config):
 * which keys of the shared vocabulary (util/jconf.h) each role reads and how
 * they fill its options struct. Pure; the fuzz target and the unit tests
 * call these directly.
 */
#ifndef ECT_PULL_CONFIG_H
#define ECT_PULL_CONFIG_H

#include <jansson.h>

#include "ectransfer.h"

/* The producer address "ec_ip:ec_port" a scheduler or consumer is built with. */
#define PULL_CONFIG_ADDR_MAX 300

/* Each fills *o from its _opts_init defaults and the keys of `json`; the
 * strings of *o point into *root (json_decref it after opening, also on
 * failure) or into addr. Returns 0 or ECT_EINVAL naming the key. */
int pull_producer_config(const char *json, ect_pull_producer_opts *o, json_t **root);
int pull_scheduler_config(const char *json, ect_pull_scheduler_opts *o, json_t **root,
                          char addr[PULL_CONFIG_ADDR_MAX]);
int pull_consumer_config(const char *json, ect_pull_consumer_opts *o, json_t **root,
                         char addr[PULL_CONFIG_ADDR_MAX]);

#endif
