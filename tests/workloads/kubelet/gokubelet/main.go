// A pod-resources List server on grpc-go, the gRPC implementation the kubelet runs, for
// tests/workloads/kubelet/test_podresources_grpcgo.py. It answers List with the bytes of a file as they are (its
// codec passes bytes through, so no generated Go code is needed), after a delay, and on
// SIGTERM stops as the kubelet does, with GracefulStop, then prints how long that took.
//
//	gokubelet SOCKET ANSWER_FILE DELAY_MS
package main

import (
	"context"
	"fmt"
	"io/ioutil"
	"net"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"google.golang.org/grpc"
)

// rawCodec hands messages over as the bytes they are.
type rawCodec struct{}

func (rawCodec) Marshal(v interface{}) ([]byte, error) { return *(v.(*[]byte)), nil }

func (rawCodec) Unmarshal(data []byte, v interface{}) error {
	*(v.(*[]byte)) = append([]byte(nil), data...)
	return nil
}

func (rawCodec) String() string { return "proto" }

var answer []byte
var delay time.Duration

func list(_ interface{}, _ context.Context, dec func(interface{}) error, _ grpc.UnaryServerInterceptor) (interface{}, error) {
	var request []byte
	if err := dec(&request); err != nil {
		return nil, err
	}
	time.Sleep(delay)
	out := answer
	return &out, nil
}

var service = grpc.ServiceDesc{
	ServiceName: "v1.PodResourcesLister",
	HandlerType: (*interface{})(nil),
	Methods:     []grpc.MethodDesc{{MethodName: "List", Handler: list}},
	Streams:     []grpc.StreamDesc{},
	Metadata:    "podresources.proto",
}

func main() {
	if len(os.Args) != 4 {
		fmt.Fprintln(os.Stderr, "usage: gokubelet SOCKET ANSWER_FILE DELAY_MS")
		os.Exit(2)
	}
	var err error
	if answer, err = ioutil.ReadFile(os.Args[2]); err != nil {
		panic(err)
	}
	ms, err := strconv.Atoi(os.Args[3])
	if err != nil {
		panic(err)
	}
	delay = time.Duration(ms) * time.Millisecond
	lis, err := net.Listen("unix", os.Args[1])
	if err != nil {
		panic(err)
	}
	server := grpc.NewServer(grpc.CustomCodec(rawCodec{}))
	server.RegisterService(&service, struct{}{})
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM)
	go server.Serve(lis)
	fmt.Println("serving")
	<-stop
	started := time.Now()
	server.GracefulStop()
	fmt.Printf("stopped in %.3f s\n", time.Since(started).Seconds())
}
