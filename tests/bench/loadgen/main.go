// Command loadgen is the HTTPS load generator of the gpu-admission benchmarks (standard library only).
//
// It POSTs request bodies over TLS with keep-alive connections and prints one JSON line with the outcome:
// requests sent, succeeded, errors by status, the achieved rate and latency percentiles in milliseconds.
//
// Two ways to offer load:
//
//	open loop  (-rate R): request k is scheduled at start + k/R on a clock, whatever happened to earlier
//	           requests, and its latency is measured from that scheduled time. A server (or a client) that
//	           stalls therefore shows the stall in every request that should have been sent meanwhile:
//	           no coordinated omission.
//	closed loop (-c N):   N workers, each sending its next request as soon as the previous one answered;
//	           this finds the saturation throughput. Latency is measured from the actual send.
//
// Requests cycle round-robin through the targets given with -req URL@FILE (repeatable) or -url/-body.
// An answer counts as ok when it is a 2xx; with -review, also the AdmissionReview v1 response to its request
// (the request's uid, a verdict); with -expect, also one that contains that substring. A request that gets no
// answer within -timeout counts as "timeout"; a refused or reset connection as "transport".
// Every occurrence of {{i}} in a body is replaced by the request's sequence number (unique names, uids).
//
// With -serve ADDR it is instead a no-op admission webhook (noop.go), the floor of any webhook's cost.
//
// Example:
//
//	loadgen -cacert ca.crt -rate 500 -duration 10s -warmup 2s \
//	    -req https://127.0.0.1:8443/mutate@pod.json -req https://127.0.0.1:8443/validate@pod.json
package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

const placeholder = "{{i}}"

type target struct {
	URL   string
	File  string
	parts [][]byte // the body split at each {{i}}
}

func (t *target) body(i int64) []byte {
	if len(t.parts) == 1 {
		return t.parts[0]
	}
	n := strconv.AppendInt(nil, i, 10)
	size := 0
	for _, p := range t.parts {
		size += len(p) + len(n)
	}
	out := make([]byte, 0, size)
	for k, p := range t.parts {
		if k > 0 {
			out = append(out, n...)
		}
		out = append(out, p...)
	}
	return out
}

type reqFlags []string

func (r *reqFlags) String() string     { return strings.Join(*r, " ") }
func (r *reqFlags) Set(v string) error { *r = append(*r, v); return nil }

type sample struct {
	target  int
	latency time.Duration
	ok      bool
	class   string // "" when ok, else the HTTP status, "timeout", "transport", "bad-review" or "unexpected-body"
	done    time.Time
}

type recorder struct {
	mu      sync.Mutex
	samples []sample
	errMsg  map[string]string
}

func (r *recorder) add(s sample, msg string) {
	r.mu.Lock()
	r.samples = append(r.samples, s)
	if s.class != "" && msg != "" {
		if _, seen := r.errMsg[s.class]; !seen {
			r.errMsg[s.class] = msg
		}
	}
	r.mu.Unlock()
}

type config struct {
	rate        float64
	conc        int
	duration    time.Duration
	warmup      time.Duration
	count       int64
	timeout     time.Duration
	conns       int
	maxInflight int
	expect      []byte
	review      bool
	token       string
	http2       bool
	offset      int64
}

type summary struct {
	Mode           string             `json:"mode"`
	OfferedRate    float64            `json:"offered_rate,omitempty"`
	Concurrency    int                `json:"concurrency,omitempty"`
	DurationS      float64            `json:"duration_s"`
	WarmupS        float64            `json:"warmup_s"`
	Sent           int                `json:"sent"`
	OK             int                `json:"ok"`
	Errors         map[string]int     `json:"errors"`
	ErrorSamples   map[string]string  `json:"error_samples,omitempty"`
	AchievedRate   float64            `json:"achieved_rate"`
	LatencyMs      map[string]float64 `json:"latency_ms"`
	DispatchLagMs  map[string]float64 `json:"dispatch_lag_ms,omitempty"`
	Connections    int64              `json:"connections"`
	Targets        []targetSummary    `json:"targets"`
	WarmupRequests int64              `json:"warmup_requests"`
}

type targetSummary struct {
	URL       string             `json:"url"`
	File      string             `json:"file"`
	Sent      int                `json:"sent"`
	OK        int                `json:"ok"`
	LatencyMs map[string]float64 `json:"latency_ms"`
}

func main() {
	var reqs reqFlags
	var (
		url        = flag.String("url", "", "target URL (with -body; or use -req)")
		bodyFile   = flag.String("body", "", "request body file for -url")
		cacert     = flag.String("cacert", "", "CA bundle (PEM) to verify the server")
		certFile   = flag.String("cert", "", "client certificate (PEM)")
		keyFile    = flag.String("key", "", "client key (PEM)")
		token      = flag.String("token", "", "bearer token")
		tokenFile  = flag.String("token-file", "", "file holding a bearer token")
		insecure   = flag.Bool("insecure", false, "skip server certificate verification")
		rate       = flag.Float64("rate", 0, "open loop: requests per second on a fixed schedule")
		conc       = flag.Int("c", 0, "closed loop: concurrent workers")
		duration   = flag.Duration("duration", 0, "measured duration (after -warmup)")
		count      = flag.Int64("n", 0, "measured request count (instead of, or as a cap with, -duration)")
		warmup     = flag.Duration("warmup", 0, "load offered before measuring (not recorded)")
		timeout    = flag.Duration("timeout", 10*time.Second, "per-request timeout")
		conns      = flag.Int("conns", 0, "max connections per host (0: as many as needed; closed loop: -c)")
		maxInfl    = flag.Int("max-inflight", 20000, "open loop: cap on outstanding requests")
		expect     = flag.String("expect", "", "a 2xx answer must contain this substring to count as ok")
		review     = flag.Bool("review", false, "a 2xx answer must be the AdmissionReview v1 answer to the request to count as ok")
		useHTTP2   = flag.Bool("h2", false, "negotiate HTTP/2 (default HTTP/1.1 with keep-alive)")
		serverName = flag.String("server-name", "", "TLS server name to verify (default: the URL host)")
		offset     = flag.Int64("offset", 0, "first value of {{i}} (runs against the same names can then not collide)")
	)
	flag.Var(&reqs, "req", "URL@FILE target (repeatable; requests cycle round-robin through them)")
	serveAddr := flag.String("serve", "", "instead of sending load, serve a no-op admission webhook on ADDR")
	flag.Parse()
	if *serveAddr != "" {
		serveNoop(*serveAddr, *certFile, *keyFile) // -cert/-key: the serving pair
		return
	}

	fail := func(format string, a ...any) {
		fmt.Fprintf(os.Stderr, "loadgen: "+format+"\n", a...)
		os.Exit(2)
	}
	if *url != "" {
		if *bodyFile == "" {
			fail("-url needs -body")
		}
		reqs = append(reqs, *url+"@"+*bodyFile)
	}
	if len(reqs) == 0 {
		fail("no target: give -req URL@FILE or -url with -body")
	}
	if (*rate > 0) == (*conc > 0) {
		fail("give exactly one of -rate (open loop) or -c (closed loop)")
	}
	if *duration <= 0 && *count <= 0 {
		fail("give -duration or -n")
	}
	var targets []*target
	for _, r := range reqs {
		at := strings.LastIndex(r, "@")
		if at <= 0 || at == len(r)-1 {
			fail("bad -req %q: want URL@FILE", r)
		}
		data, err := os.ReadFile(r[at+1:])
		if err != nil {
			fail("%v", err)
		}
		targets = append(targets, &target{URL: r[:at], File: r[at+1:], parts: bytes.Split(data, []byte(placeholder))})
	}

	tlsCfg := &tls.Config{MinVersion: tls.VersionTLS12, InsecureSkipVerify: *insecure, ServerName: *serverName}
	if *cacert != "" {
		pem, err := os.ReadFile(*cacert)
		if err != nil {
			fail("%v", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			fail("no certificate in %s", *cacert)
		}
		tlsCfg.RootCAs = pool
	}
	if *certFile != "" || *keyFile != "" {
		pair, err := tls.LoadX509KeyPair(*certFile, *keyFile)
		if err != nil {
			fail("client certificate: %v", err)
		}
		tlsCfg.Certificates = []tls.Certificate{pair}
	}
	tok := *token
	if *tokenFile != "" {
		data, err := os.ReadFile(*tokenFile)
		if err != nil {
			fail("%v", err)
		}
		tok = strings.TrimSpace(string(data))
	}

	cfg := config{
		rate: *rate, conc: *conc, duration: *duration, warmup: *warmup, count: *count, timeout: *timeout,
		conns: *conns, maxInflight: *maxInfl, expect: []byte(*expect), review: *review, token: tok, http2: *useHTTP2,
		offset: *offset,
	}
	if cfg.conns == 0 && cfg.conc > 0 {
		cfg.conns = cfg.conc
	}
	var dials int64
	dialer := &net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}
	transport := &http.Transport{
		Proxy: nil,
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			atomic.AddInt64(&dials, 1)
			return dialer.DialContext(ctx, network, addr)
		},
		TLSClientConfig:     tlsCfg,
		ForceAttemptHTTP2:   cfg.http2,
		MaxIdleConns:        0,
		MaxIdleConnsPerHost: 4096,
		MaxConnsPerHost:     cfg.conns,
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true,
		TLSHandshakeTimeout: 5 * time.Second,
	}
	if !cfg.http2 {
		transport.TLSNextProto = map[string]func(string, *tls.Conn) http.RoundTripper{}
	}
	client := &http.Client{Transport: transport, Timeout: cfg.timeout}

	rec := &recorder{errMsg: map[string]string{}}
	var lags []time.Duration
	var warmupN int64
	var measureStart time.Time
	if cfg.rate > 0 {
		measureStart, lags, warmupN = openLoop(client, targets, cfg, rec)
	} else {
		measureStart, warmupN = closedLoop(client, targets, cfg, rec)
	}
	out := summarize(rec, targets, cfg, measureStart)
	if len(lags) > 0 {
		out.DispatchLagMs = percentiles(lags)
	}
	out.Connections = atomic.LoadInt64(&dials)
	out.WarmupRequests = warmupN
	enc := json.NewEncoder(os.Stdout)
	if err := enc.Encode(out); err != nil {
		fail("%v", err)
	}
}

// send performs request i and records it (when measured) with its latency from `from`.
func send(client *http.Client, targets []*target, cfg config, rec *recorder, i int64, from time.Time, measured bool) {
	ti := int(i % int64(len(targets)))
	t := targets[ti]
	payload := t.body(cfg.offset + i)
	req, err := http.NewRequest(http.MethodPost, t.URL, bytes.NewReader(payload))
	if err != nil {
		rec.add(sample{target: ti, class: "transport", done: time.Now()}, err.Error())
		return
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json")
	if cfg.token != "" {
		req.Header.Set("Authorization", "Bearer "+cfg.token)
	}
	resp, err := client.Do(req)
	var body []byte
	if err == nil {
		body, err = io.ReadAll(resp.Body)
		resp.Body.Close()
	}
	done := time.Now()
	if !measured {
		return
	}
	s := sample{target: ti, latency: done.Sub(from), done: done}
	msg := ""
	switch {
	case err != nil:
		s.class = "transport"
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			s.class = "timeout"
		}
		msg = err.Error()
	case resp.StatusCode/100 != 2:
		s.class = strconv.Itoa(resp.StatusCode)
		msg = string(body[:min(len(body), 300)])
	case cfg.review && !answers(payload, body):
		s.class = "bad-review"
		msg = string(body[:min(len(body), 300)])
	case len(cfg.expect) > 0 && !bytes.Contains(body, cfg.expect):
		s.class = "unexpected-body"
		msg = string(body[:min(len(body), 300)])
	default:
		s.ok = true
	}
	rec.add(s, msg)
}

// envelope is what -review reads of an AdmissionReview: the request's uid, the response's uid and verdict.
type envelope struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Request    *struct {
		UID string `json:"uid"`
	} `json:"request"`
	Response *struct {
		UID     string `json:"uid"`
		Allowed *bool  `json:"allowed"`
	} `json:"response"`
}

// answers says whether `response` is the AdmissionReview v1 answer to the AdmissionReview `request`: a server
// that answers 200 with garbage, another request's uid or no verdict is as wrong as one that answers 500.
func answers(request, response []byte) bool {
	var in, out envelope
	if json.Unmarshal(request, &in) != nil || in.Request == nil || json.Unmarshal(response, &out) != nil {
		return false
	}
	return out.APIVersion == "admission.k8s.io/v1" && out.Kind == "AdmissionReview" && out.Response != nil &&
		out.Response.UID == in.Request.UID && out.Response.Allowed != nil
}

// openLoop sends on the schedule; it returns the dispatch lags (how late each request left, measured
// requests only): they are part of the latencies reported, so they must stay small against them.
func openLoop(client *http.Client, targets []*target, cfg config, rec *recorder) (time.Time, []time.Duration, int64) {
	var wg sync.WaitGroup
	sem := make(chan struct{}, cfg.maxInflight)
	start := time.Now().Add(5 * time.Millisecond)
	measureStart := start.Add(cfg.warmup)
	warmupN := int64(math.Ceil(cfg.warmup.Seconds() * cfg.rate))
	var lags []time.Duration
	for k := int64(0); ; k++ {
		offset := time.Duration(float64(k) / cfg.rate * 1e9)
		if cfg.duration > 0 && offset >= cfg.warmup+cfg.duration {
			break
		}
		if cfg.count > 0 && k >= warmupN+cfg.count {
			break
		}
		sched := start.Add(offset)
		if d := time.Until(sched); d > 0 {
			time.Sleep(d)
		}
		sem <- struct{}{} // a full cap delays sending, never the schedule the latency is measured from
		if k >= warmupN {
			lags = append(lags, time.Since(sched))
		}
		wg.Add(1)
		go func(k int64, sched time.Time) {
			defer wg.Done()
			defer func() { <-sem }()
			send(client, targets, cfg, rec, k, sched, k >= warmupN)
		}(k, sched)
	}
	wg.Wait()
	return measureStart, lags, warmupN
}

func closedLoop(client *http.Client, targets []*target, cfg config, rec *recorder) (time.Time, int64) {
	var wg sync.WaitGroup
	var next, measuredN, warmupN int64
	start := time.Now()
	measureStart := start.Add(cfg.warmup)
	end := measureStart.Add(cfg.duration)
	for w := 0; w < cfg.conc; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				now := time.Now()
				measured := !now.Before(measureStart)
				if cfg.duration > 0 && !now.Before(end) {
					return
				}
				if measured && cfg.count > 0 && atomic.AddInt64(&measuredN, 1) > cfg.count {
					return
				}
				if !measured {
					atomic.AddInt64(&warmupN, 1)
				}
				k := atomic.AddInt64(&next, 1) - 1
				send(client, targets, cfg, rec, k, now, measured)
			}
		}()
	}
	wg.Wait()
	return measureStart, warmupN
}

func percentiles(lat []time.Duration) map[string]float64 {
	out := map[string]float64{}
	if len(lat) == 0 {
		return out
	}
	sort.Slice(lat, func(a, b int) bool { return lat[a] < lat[b] })
	ms := func(d time.Duration) float64 { return math.Round(float64(d)/1e3) / 1e3 }
	rank := func(p float64) time.Duration { // nearest rank
		k := int(math.Ceil(p/100*float64(len(lat)))) - 1
		return lat[max(0, min(k, len(lat)-1))]
	}
	var sum time.Duration
	for _, d := range lat {
		sum += d
	}
	out["min"] = ms(lat[0])
	out["p50"] = ms(rank(50))
	out["p90"] = ms(rank(90))
	out["p95"] = ms(rank(95))
	out["p99"] = ms(rank(99))
	out["p999"] = ms(rank(99.9))
	out["max"] = ms(lat[len(lat)-1])
	out["mean"] = ms(sum / time.Duration(len(lat)))
	return out
}

func summarize(rec *recorder, targets []*target, cfg config, measureStart time.Time) summary {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	out := summary{
		Mode: "closed", Concurrency: cfg.conc, WarmupS: cfg.warmup.Seconds(),
		Errors: map[string]int{}, ErrorSamples: rec.errMsg,
	}
	if cfg.rate > 0 {
		out.Mode, out.OfferedRate, out.Concurrency = "open", cfg.rate, 0
	}
	var all []time.Duration
	per := make([][]time.Duration, len(targets))
	sent := make([]int, len(targets))
	okN := make([]int, len(targets))
	last := measureStart
	for _, s := range rec.samples {
		sent[s.target]++
		if s.done.After(last) {
			last = s.done
		}
		if !s.ok {
			out.Errors[s.class]++
			continue
		}
		okN[s.target]++
		all = append(all, s.latency)
		per[s.target] = append(per[s.target], s.latency)
	}
	out.Sent = len(rec.samples)
	out.OK = len(all)
	window := last.Sub(measureStart).Seconds()
	if cfg.duration > 0 && cfg.conc > 0 {
		window = math.Max(window, cfg.duration.Seconds())
	}
	out.DurationS = math.Round(window*1000) / 1000
	if window > 0 {
		out.AchievedRate = math.Round(float64(out.OK)/window*10) / 10
	}
	out.LatencyMs = percentiles(all)
	for k, t := range targets {
		out.Targets = append(out.Targets, targetSummary{
			URL: t.URL, File: t.File, Sent: sent[k], OK: okN[k], LatencyMs: percentiles(per[k]),
		})
	}
	return out
}
