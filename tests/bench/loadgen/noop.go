package main

// The -serve mode: a no-op admission webhook (allowed, no patch) over HTTPS/1.1, the floor of what calling
// out to any webhook costs. The benchmarks register it with the same rules and matchConditions as ours.

import (
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"sync/atomic"
	"time"
)

type reviewIn struct {
	Request struct {
		UID string `json:"uid"`
	} `json:"request"`
}

type reviewOut struct {
	APIVersion string      `json:"apiVersion"`
	Kind       string      `json:"kind"`
	Response   reviewReply `json:"response"`
}

type reviewReply struct {
	UID     string `json:"uid"`
	Allowed bool   `json:"allowed"`
}

func serveNoop(addr, certFile, keyFile string) {
	pair, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		fmt.Fprintf(os.Stderr, "loadgen: serve: %v\n", err)
		os.Exit(2)
	}
	var served int64
	mux := http.NewServeMux()
	admit := func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		var in reviewIn
		if err == nil {
			err = json.Unmarshal(body, &in)
		}
		if err != nil || in.Request.UID == "" {
			http.Error(w, "not an AdmissionReview", http.StatusBadRequest)
			return
		}
		atomic.AddInt64(&served, 1)
		out, _ := json.Marshal(reviewOut{"admission.k8s.io/v1", "AdmissionReview", reviewReply{in.Request.UID, true}})
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(out)
	}
	mux.HandleFunc("/admit", admit)
	mux.HandleFunc("/mutate", admit)
	mux.HandleFunc("/validate", admit)
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "ok %d\n", atomic.LoadInt64(&served))
	})
	srv := &http.Server{
		Addr:         addr,
		Handler:      mux,
		TLSConfig:    &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{pair}},
		TLSNextProto: map[string]func(*http.Server, *tls.Conn, http.Handler){}, // HTTP/1.1, as our server
		ReadTimeout:  30 * time.Second,
		IdleTimeout:  90 * time.Second,
	}
	fmt.Fprintf(os.Stderr, "loadgen: no-op webhook on https://%s\n", addr)
	if err := srv.ListenAndServeTLS("", ""); err != nil {
		fmt.Fprintf(os.Stderr, "loadgen: serve: %v\n", err)
		os.Exit(1)
	}
}
