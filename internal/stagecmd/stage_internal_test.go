package stagecmd

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/tollgate-dev/tollgate"
	"github.com/tollgate-dev/tollgate/internal/pipelinetest"
	"github.com/tollgate-dev/tollgate/internal/scaffold"
	"github.com/tollgate-dev/tollgate/jetstream/jstest"
	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/seal"
)

// A stage process (runStage, what Main runs) runs its one stage: its
// durable consumer appears and no later stage's does. Only the executor and
// the redriver, which run tools, create the sandbox. Cancelling drains the
// stage and returns nil.
func TestAStageProcessRunsItsStageOnly(t *testing.T) {
	env := jstest.Start(t)
	keyFile := filepath.Join(t.TempDir(), "seal-keys.json")
	if err := seal.NewFile("k1").Write(keyFile); err != nil {
		t.Fatal(err)
	}
	consumers := topology.Consumers() // in the order of tollgate.AllStages
	for i, stage := range tollgate.AllStages() {
		sandbox := filepath.Join(t.TempDir(), "sandbox")
		c := scaffold.Common{NATSURL: env.URL(), LogLevel: "info", Replicas: 1, SandboxDir: sandbox, SealKeys: keyFile, ToolServices: true}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- runStage(ctx, stage, c, pipelinetest.Logger()) }()
		own := consumers[i]
		jstest.Eventually(t, pipelinetest.Wait, "consumer "+own.Config.Durable, func() bool {
			_, err := env.JS.Consumer(context.Background(), own.Stream, own.Config.Durable)
			return err == nil
		})
		cancel()
		if err := <-done; err != nil {
			t.Fatalf("%s after cancel: %v", stage, err)
		}
		for _, later := range consumers[i+1:] {
			if _, err := env.JS.Consumer(context.Background(), later.Stream, later.Config.Durable); err == nil {
				t.Errorf("the %s process created consumer %s", stage, later.Config.Durable)
			}
		}
		_, err := os.Stat(sandbox)
		if runsTools := stage == tollgate.StageExecutor || stage == tollgate.StageRedriver; (err == nil) != runsTools {
			t.Errorf("%s: sandbox stat %v; want it created only by a stage that runs tools", stage, err)
		}
	}
}
