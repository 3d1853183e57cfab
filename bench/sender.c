/* The benchmark's traffic source: UDP datagrams to a sink socket on 127.0.0.1 with sendmmsg, as fast as it can
 * or at a given rate. Compiled at run time by bench (cc -O2) into a temporary directory; never committed.
 *
 *   sender PAYLOAD COUNT RATE_PPS [BATCH [DRAIN [PORT]]]      RATE_PPS 0 = full speed; PORT 0 = any free port
 *
 * The sink is a bound UDP socket this process never reads (so no ICMP port-unreachable comes back; datagrams
 * past its receive buffer are dropped by the kernel after every capture point). Each payload starts with the
 * magic "fcapbnch" and a 64-bit sequence number, so a capture file's share of the traffic can be counted.
 * Prints one line: "sent N ns NS port PORT". */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define MAXBATCH 256

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: %s PAYLOAD COUNT RATE_PPS [BATCH]\n", argv[0]);
        return 2;
    }
    int size = atoi(argv[1]);
    long long count = atoll(argv[2]);
    double rate = atof(argv[3]);
    int batch = argc > 4 ? atoi(argv[4]) : 32;
    int drain = argc > 5 ? atoi(argv[5]) : 1;
    int port = argc > 6 ? atoi(argv[6]) : 0;
    if (size < 16 || size > 65000 || count < 1 || batch < 1 || batch > MAXBATCH) {
        fprintf(stderr, "sender: bad arguments\n");
        return 2;
    }
    if (port < 0 || port > 65535) {
        fprintf(stderr, "sender: bad port\n");
        return 2;
    }
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK),
                             .sin_port = htons((uint16_t)port)};
    int sink = socket(AF_INET, SOCK_DGRAM, 0);
    int rcvbuf = drain ? 8 << 20 : 4096;
    setsockopt(sink, SOL_SOCKET, SO_RCVBUFFORCE, &rcvbuf, sizeof rcvbuf);
    if (sink < 0 || bind(sink, (struct sockaddr *)&sa, sizeof sa) < 0) {
        perror("sender: sink socket");
        return 1;
    }
    socklen_t salen = sizeof sa;
    getsockname(sink, (struct sockaddr *)&sa, &salen);
    int s = socket(AF_INET, SOCK_DGRAM, 0);
    if (s < 0 || connect(s, (struct sockaddr *)&sa, sizeof sa) < 0) {
        perror("sender: socket");
        return 1;
    }
    static char bufs[MAXBATCH][65000];
    static struct iovec iov[MAXBATCH];
    static struct mmsghdr msgs[MAXBATCH];
    for (int i = 0; i < batch; i++) {
        memset(bufs[i], 0x5a, size);
        memcpy(bufs[i], "fcapbnch", 8);
        iov[i].iov_base = bufs[i];
        iov[i].iov_len = size;
        msgs[i].msg_hdr.msg_iov = &iov[i];
        msgs[i].msg_hdr.msg_iovlen = 1;
    }
    uint64_t seq = 0;
    uint64_t t0 = now_ns();
    double gap = rate > 0 ? 1e9 / rate : 0;
    while ((long long)seq < count) {
        int n = batch;
        if ((long long)(count - seq) < n)
            n = (int)(count - seq);
        if (gap > 0) {  /* the batch's start time on a fixed schedule: no drift, no catching up in bursts */
            uint64_t due = t0 + (uint64_t)(seq * gap);
            uint64_t t = now_ns();
            if (due > t + 50000) {
                struct timespec ts = {.tv_sec = (time_t)(due / 1000000000ull), .tv_nsec = (long)(due % 1000000000ull)};
                clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL);
            }
            while (now_ns() < due)
                ;
        }
        for (int i = 0; i < n; i++)
            memcpy(bufs[i] + 8, &(uint64_t){seq + i}, 8);
        int r = sendmmsg(s, msgs, n, 0);
        if (r < 0) {
            if (errno == EINTR || errno == ENOBUFS || errno == EAGAIN)
                continue;
            perror("sender: sendmmsg");
            return 1;
        }
        seq += r;
        if (drain) {  /* read what arrived: consumed datagrams take no drop path (kfree_skb) */
            struct mmsghdr rm[MAXBATCH];
            static char rb[MAXBATCH][64];
            struct iovec riov[MAXBATCH];
            for (int i = 0; i < r; i++) {
                riov[i].iov_base = rb[i];
                riov[i].iov_len = sizeof rb[i];
                memset(&rm[i].msg_hdr, 0, sizeof rm[i].msg_hdr);
                rm[i].msg_hdr.msg_iov = &riov[i];
                rm[i].msg_hdr.msg_iovlen = 1;
            }
            while (recvmmsg(sink, rm, r, MSG_DONTWAIT, NULL) > 0)
                ;
        }
    }
    uint64_t t1 = now_ns();
    printf("sent %llu ns %llu port %d\n", (unsigned long long)seq, (unsigned long long)(t1 - t0), ntohs(sa.sin_port));
    return 0;
}
