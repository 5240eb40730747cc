/*
 * control_event — the events a consumer shard pushes to its scheduler.
 *
 * Upstream builds a readiness event as {"transfer_id": id, **status(id)} and
 * then sets "shard", so its keys come in the status result's order. An
 * abandoned reservation is reported with the same keys and "ready": false;
 * this project adds "abandoned": true and an "error" reason after them, which
 * upstream's scheduler ignores. The decoder therefore treats ready == false
 * as abandoned whether or not the extension keys are present.
 */
#include <stdlib.h>
#include <string.h>

#include "util/util.h"
#include "wire/control_msg.h"

void wire_event_clear(wire_event *ev) {
    if (!ev) return;
    free(ev->error);
    memset(ev, 0, sizeof *ev);
}

int wire_ctl_encode_event(const wire_event *ev, char **out) {
    *out = NULL;
    if (!ev) return ect_set_error(ECT_EINVAL, "NULL event");
    if (ev->shard == 0) return ect_set_error(ECT_EINVAL, "shard: port 0 is not a control port");
    int frc = wctl_fast_encode_event(ev, out);
    if (frc != WCTL_FALLBACK) return frc;
    json_t *o = json_object();
    if (!o) return ect_set_error(ECT_ENOMEM, "out of memory encoding JSON");
    int rc = 0;
    wctl_put_str(o, "transfer_id", ev->transfer_id, WIRE_ID_MAX, true, &rc);
    wctl_put_str(o, "mm_hash", ev->mm_hash, WIRE_ID_MAX, true, &rc);
    wctl_put_bool(o, "ready", ev->ready, &rc);
    wctl_put_str(o, "reservation_id", ev->reservation_id, WIRE_ID_MAX, false, &rc);
    wctl_put_tensor(o, &ev->tensor, &rc);
    wctl_put_u64(o, "shard", ev->shard, &rc);
    if (!ev->ready) {
        wctl_put_bool(o, "abandoned", true, &rc);
        if (ev->error) wctl_put_text(o, "error", ev->error, &rc);
    }
    if (rc) {
        json_decref(o);
        return rc;
    }
    return wctl_dump(o, out);
}

int wire_ctl_decode_event(const void *buf, size_t len, wire_event *out) {
    int frc = wctl_fast_decode_event(buf, len, out);
    if (frc != WCTL_FALLBACK) return frc;
    memset(out, 0, sizeof *out);
    json_t *root;
    int rc = wctl_load(buf, len, &root);
    if (rc) return rc;
    bool abandoned = false;
    rc = wctl_get_str(root, "", "transfer_id", true, true, WIRE_ID_MAX, out->transfer_id);
    if (!rc) rc = wctl_get_str(root, "", "mm_hash", true, true, WIRE_ID_MAX, out->mm_hash);
    if (!rc) rc = wctl_get_bool(root, "", "ready", true, &out->ready);
    if (!rc)
        rc =
            wctl_get_str(root, "", "reservation_id", true, false, WIRE_ID_MAX, out->reservation_id);
    if (!rc) rc = wctl_get_tensor(root, "", &out->tensor);
    if (!rc) rc = wctl_get_port(root, "", "shard", &out->shard);
    if (!rc) rc = wctl_get_bool(root, "", "abandoned", false, &abandoned);
    if (!rc && abandoned && out->ready)
        rc = ect_set_error(ECT_EINVAL, "abandoned: true contradicts ready: true");
    if (!rc && !out->ready)
        rc = wctl_get_str_dup(root, "", "error", false, WIRE_ERROR_MAX, &out->error);
    json_decref(root);
    if (rc) wire_event_clear(out);
    return rc;
}
