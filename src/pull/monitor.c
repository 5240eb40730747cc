/* monitor — see pull_internal.h. */
#include <stdbool.h>
#include <stdint.h>
#include <string.h>
#include <zmq.h>

#include "pull/pull_internal.h"

int pull_monitor_next(void *mon) {
    zmq_msg_t ev;
    zmq_msg_init(&ev);
    if (zmq_msg_recv(&ev, mon, ZMQ_DONTWAIT) < 0) {
        zmq_msg_close(&ev);
        return -1;
    }
    uint16_t id = 0;
    if (zmq_msg_size(&ev) >= 2) memcpy(&id, zmq_msg_data(&ev), 2);
    bool more = zmq_msg_more(&ev);
    zmq_msg_close(&ev);
    while (more) { /* the endpoint frame (a monitor message arrives whole) */
        zmq_msg_t addr;
        zmq_msg_init(&addr);
        if (zmq_msg_recv(&addr, mon, ZMQ_DONTWAIT) < 0)
            more = false;
        else
            more = zmq_msg_more(&addr);
        zmq_msg_close(&addr);
    }
    return id;
}
